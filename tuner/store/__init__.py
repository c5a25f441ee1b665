"""The database: the project's tables beside Optuna's (`schema`), connections and migrations (`engine`), and what
is written and read there: trial outcomes (`ledger`), study lifecycle (`lifecycle`), API tokens (`tokens`), and the
read models of studies and trials (`views`, `studies`, `trials`, `progress`) that the CLI, the API and the
dashboard show, so all three agree. The CLI and the API go through one `Storage` object (`storage`); Optuna's
private parts come through `optuna_internals` only.
"""
