"""The private parts of Optuna and Ray Tune the project relies on, each behind one adapter module, still exist
and mean what the adapters assume. A release that changes one fails here, by name, not somewhere downstream."""

from __future__ import annotations

import logging

import optuna
from optuna.distributions import FloatDistribution
from ray.tune.search.optuna import OptunaSearch

from lm_tuner.tuner.run import ray_quiet
from lm_tuner.tuner.store import optuna_internals

RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"  # what ray_quiet.quiet_ray filters


def test_optunas_tables_have_the_columns_the_queries_join():
    used = {
        optuna_internals.TRIALS: {"trial_id", "study_id", "number", "state", "datetime_start", "datetime_complete"},
        optuna_internals.PARAMS: {"trial_id", "param_name", "param_value", "distribution_json"},
        optuna_internals.USER_ATTRIBUTES: {"trial_id", "key", "value_json"},
    }
    for table, columns in used.items():
        assert columns <= set(table.columns.keys()), f"Optuna's {table.name} table changed"
    assert optuna_internals.optuna_models.StudyModel.__tablename__ == "studies"


def test_frozen_trials_and_studies_carry_their_storage_ids(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    optuna.create_study(storage=storage, study_name="first").optimize(lambda trial: 1.0, n_trials=2)
    study = optuna.create_study(storage=storage, study_name="second")
    study.optimize(lambda trial: 1.0, n_trials=1)
    (summary,) = [s for s in storage.get_all_studies() if s.study_name == "second"]
    study_id = optuna_internals.storage_study_id(summary)
    assert study_id == storage.get_study_id_from_name("second")
    (trial,) = storage.get_all_trials(study_id)
    assert optuna_internals.storage_trial_id(trial) == storage.get_trial_id_from_study_id_trial_number(study_id, 0)
    assert optuna_internals.storage_trial_id(trial) == 3  # ids count from 1 across studies: the third trial


def test_ray_optuna_search_keeps_the_state_the_study_searcher_reads(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    optuna.create_study(storage=storage, study_name="searched", direction="minimize")
    searcher = OptunaSearch(space={"x": FloatDistribution(0, 1)}, metric="loss", mode="min", study_name="searched",
                            storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    params = searcher.suggest("trial-1")
    assert set(params) == {"x"}
    assert isinstance(searcher._ot_trials["trial-1"], optuna.Trial)
    assert isinstance(searcher._ot_study, optuna.Study) and searcher._storage is storage
    assert isinstance(searcher._completed_trials, set)
    searcher.on_trial_complete("trial-1", {"loss": 0.5})
    assert "trial-1" in searcher._completed_trials
    assert storage.get_all_trials(storage.get_study_id_from_name("searched"))[0].value == 0.5


def test_rays_token_auth_notice_comes_from_the_logger_and_text_ray_quiet_filters(monkeypatch):
    from ray._private.authentication import authentication_token_setup

    logger = logging.getLogger(RAY_AUTH_LOGGER)
    assert authentication_token_setup.logger is logger, f"Ray moved its token-auth logger off {RAY_AUTH_LOGGER}"
    seen = _Records()
    logger.addHandler(seen)
    for variable in ray_quiet.QUIET_ENVIRONMENT:  # quiet_ray sets them; restored after the test
        monkeypatch.delenv(variable, raising=False)
    # from the logger as Ray leaves it: earlier tests in this process may have run quiet_ray or set logging up anew
    saved = list(logger.filters), logger.disabled, logger.level, logging.root.manager.disable
    logger.filters, logger.disabled = [], False
    logger.setLevel(logging.NOTSET)  # setLevel and disable also clear the loggers' cached levels
    logging.disable(logging.NOTSET)
    try:
        authentication_token_setup._warn_token_auth_enabled()
        assert [r.getMessage() for r in seen.records if r.getMessage().startswith(ray_quiet.AUTH_NOTICE)], (
            f"Ray's notice no longer starts with {ray_quiet.AUTH_NOTICE!r}: {[r.getMessage() for r in seen.records]}")
        seen.records.clear()
        ray_quiet.quiet_ray()
        authentication_token_setup._warn_token_auth_enabled()
        assert not seen.records, "ray_quiet.quiet_ray no longer drops Ray's token-auth notice"
    finally:
        logger.removeHandler(seen)
        logger.removeFilter(ray_quiet._DROP_AUTH_NOTICE)
        logger.filters, logger.disabled = saved[0], saved[1]
        logger.setLevel(saved[2])
        logging.disable(saved[3])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
