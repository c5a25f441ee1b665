"""The tuner: a study declared in a spec, tuned by Optuna's samplers on Ray Tune, kept in one SQL database.

Subpackages, each with one job (imports point down this list, never up):

- `spec`: the YAML/JSON document, validated once into typed objects; hyperparameters and search spaces;
- `store`: the database (the project's tables beside Optuna's, migrations), and the read models of studies
  and trials that the CLI, the API and the dashboard show;
- `run`: running a study (the controller, trials on Ray Tune, later stages, the queue and its worker);
- `analysis`: what a study's trials say (comparison of the families, sensitivity, frames for figures);
- `cli`: the `tuner` command, the outermost layer.
"""
