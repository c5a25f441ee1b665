"""After tuning: reruns with new seeds, the test protocol, stage-2 dynamic evaluation, the comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import func, select

from lm_tuner.tuner.analysis.comparison import comparison
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.space import RERUN_SEED_OFFSET, rerun_seed
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import EvaluationRecord, TrialRecord
from tests.conftest import TINY_SPEC, serve_app

pytestmark = pytest.mark.slow

STAGED = {
    **TINY_SPEC,
    "name": "staged",
    "fixed": {**TINY_SPEC["fixed"], "output_dropout": 0.2},  # without dropout MC evaluation is the deterministic one
    "reruns": {"top": 1, "seeds": 2},
    "evaluation": {"bptt": 10, "temperature": True, "mc_samples": 2, "mc_multiplier": 0.5},
    "dynamic_evaluation": {
        "top": 1, "trials": 2, "sampler": "random", "rms_batch_size": 16, "rms_windows": 2,
        "search_space": {"max_time_steps": {"low": 1, "high": 5}, "learning_rate": {"low": 1e-5, "high": 1e-3,
                                                                                    "log": True},
                         "decay": {"low": 1e-5, "high": 1e-2, "log": True},
                         "epsilon": {"low": 1e-6, "high": 1e-3, "log": True}},
    },
}


@pytest.fixture(scope="module")
def staged(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    document = yaml.safe_dump(STAGED)
    assert launch_study(parse_spec(document), document, settings) == "complete"
    return settings, document


def trials_of(url: str, stage: str) -> list[TrialRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(TrialRecord).where(TrialRecord.stage == stage)
                                    .order_by(TrialRecord.family, TrialRecord.number)))


def evaluations(url: str) -> list[EvaluationRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(EvaluationRecord)))


def test_reruns_repeat_the_best_configuration_with_new_seeds(staged):
    settings, _ = staged
    url = settings.storage_url
    tuned = {t.family: t for t in trials_of(url, "tune")}
    reruns = trials_of(url, "rerun")
    assert sorted(t.family for t in reruns) == ["lstm", "lstm", "mogrifier", "mogrifier"]
    storage = optuna.storages.RDBStorage(url)
    for rerun in reruns:
        parent = tuned[rerun.family]
        assert rerun.parent_trial_id == parent.trial_id and rerun.state == "COMPLETE"
        assert storage.get_trial(rerun.trial_id).params == storage.get_trial(parent.trial_id).params
        assert rerun.seed >= RERUN_SEED_OFFSET  # never a seed a tuning trial used
    seeds = {family: sorted(t.seed for t in reruns if t.family == family) for family in ("lstm", "mogrifier")}
    assert seeds["lstm"] == seeds["mogrifier"] == [rerun_seed(parse_spec(yaml.safe_dump(STAGED)), r) for r in (0, 1)]
    folders = {p.parent for p in settings.artifact_root.glob("staged/*/rerun/trial-*/best.pt")}
    assert len(folders) == 4  # each rerun keeps its own checkpoint beside the tuning trials'
    started = sorted(reruns, key=lambda t: storage.get_trial(t.trial_id).datetime_start)
    assert {t.family for t in started[:2]} == {"lstm", "mogrifier"}  # the families' reruns interleaved, two slots


def test_final_checkpoints_are_evaluated_with_the_test_protocol(staged):
    settings, _ = staged
    url = settings.storage_url
    evaluated = {(e.trial_id, e.kind): e for e in evaluations(url)}
    final = [t.trial_id for t in trials_of(url, "rerun")]
    best_tuned = [t.trial_id for t in trials_of(url, "tune")]  # one tuning trial per family here
    for trial_id in final + best_tuned:
        deterministic, mc = evaluated[(trial_id, "deterministic")], evaluated[(trial_id, "mc")]
        assert 0 < deterministic.valid_loss < 10 and 0 < deterministic.test_loss < 10
        assert 0.8 <= deterministic.logit_scale <= 1.06  # the temperature grid
        assert mc.settings["mc_samples"] == 2 and mc.valid_loss != deterministic.valid_loss


def test_stage_two_tunes_dynamic_evaluation_per_checkpoint_with_lineage(staged):
    settings, _ = staged
    url = settings.storage_url
    stage_two = trials_of(url, "dyneval")
    assert len(stage_two) == 4 and all(t.state == "COMPLETE" for t in stage_two)
    dynamic = [e for e in evaluations(url) if e.kind == "dynamic"]
    assert len(dynamic) == 2  # the best final checkpoint of each family
    storage = optuna.storages.RDBStorage(url)
    for result in dynamic:
        chosen = next(t for t in stage_two if t.trial_id == result.dyneval_trial_id)
        assert chosen.parent_trial_id == result.trial_id  # adapted that very checkpoint
        siblings = [t for t in stage_two if t.parent_trial_id == result.trial_id]
        assert chosen.value == min(t.value for t in siblings)  # the best settings on validation
        assert result.settings["dynamic_evaluation"] == storage.get_trial(chosen.trial_id).params
        assert result.valid_loss == pytest.approx(chosen.value, rel=1e-6)  # the same adaptation, again
    assert {e.trial_id for e in evaluations(url) if e.kind == "dynamic_mc"} == {e.trial_id for e in dynamic}


def test_comparison_table_names_the_winner_by_the_rerun_mean(staged):
    settings, _ = staged
    table = comparison(settings.storage_url, "staged")
    assert table.unit == "perplexity" and [row.family for row in table.families] == ["lstm", "mogrifier"]
    for row in table.families:
        for name in ("valid", "test", "mc_valid", "mc_test", "dynamic_valid", "dynamic_test"):
            assert getattr(row, name) is not None, name
        assert row.valid.count == 2 and row.dynamic_valid.count == 1
        assert len(row.lineage) == 1 and row.lineage[0].dyneval_trial_id is not None
    means = {row.family: row.valid.mean for row in table.families}
    leader = min(means, key=means.get)
    # named only where the seeds separate it from the runner-up (the 95% interval of the difference excludes 0)
    assert table.margin.runner_up != leader and (table.winner == leader) == table.margin.separated
    assert table.winner is not None or table.verdict.startswith(f"no clear winner at this budget: {leader} is ahead")
    assert "reruns" in table.winner_by
    with serve_app(settings) as base_url:
        served = httpx.get(f"{base_url}/studies/staged/comparison").json()
        assert served["winner"] == table.winner
        assert served["families"][0]["valid"]["mean"] == pytest.approx(table.families[0].valid.mean)
        by_stage = httpx.get(f"{base_url}/studies/staged/trials", params={"stage": "rerun"}).json()
        assert by_stage["total"] == 4 and {t["stage"] for t in by_stage["items"]} == {"rerun"}
        study = httpx.get(f"{base_url}/studies/staged").json()
        assert study["counts"]["COMPLETE"] == 2  # counts are the tuning trials'; progress covers every stage
    cli = subprocess.run([sys.executable, "-m", "lm_tuner.tuner",
                          "compare", "staged", "--storage", settings.storage_url,
                          "--json"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert json.loads(cli.stdout)["winner"] == table.winner


def test_relaunch_does_no_work_twice(staged):
    settings, document = staged
    url = settings.storage_url
    with sessions(url)() as session:
        before = (session.scalar(select(func.count()).select_from(TrialRecord)),
                  session.scalar(select(func.count()).select_from(EvaluationRecord)))
    assert launch_study(parse_spec(document), document, settings) == "complete"
    with sessions(url)() as session:
        after = (session.scalar(select(func.count()).select_from(TrialRecord)),
                 session.scalar(select(func.count()).select_from(EvaluationRecord)))
    assert after == before
    states = {t.state for s in optuna.get_all_study_summaries(url)
              for t in optuna.load_study(study_name=s.study_name, storage=url).get_trials()}
    assert states == {TrialState.COMPLETE}
