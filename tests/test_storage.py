"""Storage: the database as one object, the same answers as the queries it stands for, on SQLite and PostgreSQL."""

from __future__ import annotations

import optuna
import pytest

from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.optuna_names import optuna_study_name
from lm_tuner.tuner.store.storage import Storage
from lm_tuner.tuner.store.tokens import TokenError
from tests.conftest import TINY_SPEC


def test_a_study_through_storage(storage_url, tmp_path):
    storage = Storage(storage_url)
    storage.upgrade()
    assert storage.revision() is not None and storage.studies().total == 0
    submit_study(storage_url, parse_spec({**TINY_SPEC, "name": "held"}), "name: held")
    assert storage.study_exists("held") and not storage.study_exists("other")
    study = storage.study("held")
    assert study.status == "queued" and [s.name for s in storage.studies(status="queued").items] == ["held"]
    assert set(study.families) <= set(storage.families())
    assert storage.trials("held").total == 0 and storage.trial(1) is None
    assert storage.best_trials("held") == dict.fromkeys(study.families)
    assert storage.artifact_root("held") is None  # recorded by the process that runs it
    assert storage.cancel("held") == "cancelled" and storage.study("held").status == "cancelled"
    storage.delete("held", tmp_path)
    assert storage.study("held") is None and storage.best_trials("held") is None
    assert storage.optuna().get_all_studies() == []


def test_delete_removes_every_optuna_study_of_the_study_and_no_other(storage_url, tmp_path):
    """Reruns, stage-2 and sensitivity studies go too: a study launched again under the name must not find the old
    one's queued sensitivity runs or count its trials. A study whose name only starts the same (`_` is a wildcard
    in SQL's LIKE) keeps its own."""
    storage = Storage(storage_url)
    storage.upgrade()
    for name in ("held", "heldx", "hel_d"):
        submit_study(storage_url, parse_spec({**TINY_SPEC, "name": name}), f"name: {name}")
        storage.cancel(name)
    stages = [(), ("reruns",), ("dyneval", "3"), ("sensitivity",)]
    for name in ("held", "heldx", "hel_d"):
        for stage in stages:
            optuna.create_study(study_name=optuna_study_name(name, "lstm", *stage), storage=storage.optuna())
    storage.delete("hel_d", tmp_path)
    left = sorted(s.study_name for s in storage.optuna().get_all_studies())
    assert left == sorted(optuna_study_name(name, "lstm", *stage) for name in ("held", "heldx") for stage in stages)
    storage.delete("held", tmp_path)
    assert sorted(s.study_name for s in storage.optuna().get_all_studies()) == sorted(
        optuna_study_name("heldx", "lstm", *stage) for stage in stages)


def test_tokens_through_storage(storage_url):
    storage = Storage(storage_url)
    storage.upgrade()
    assert not storage.auth_enabled() and storage.list_tokens() == []
    secret = storage.create_token("ci")
    assert storage.auth_enabled() and storage.token_is_valid(secret) and not storage.token_is_valid("x" * 40)
    with pytest.raises(TokenError):
        storage.create_token("ci")
    storage.revoke_token("ci")
    assert not storage.token_is_valid(secret) and [t.name for t in storage.list_tokens()] == ["ci"]
    storage.set_auth(False)
    assert not storage.auth_enabled()
    first = storage.initial_token("first")  # off and no token of that name: a first start makes it
    assert storage.token_is_valid(first) and storage.auth_enabled()
    assert storage.initial_token("first") is None  # a later start leaves things as they are
