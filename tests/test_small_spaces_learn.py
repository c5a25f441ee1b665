"""Every shipped small space (the CPU-sized twins and the demo) runs with none of its own warnings and learns: its best
tuning trial beats the unigram baseline of its corpus clearly. small/mogrifier_ptb once warned of a hidden size of 4
and of evaluation's share of a 0.1 s trial, and its Mogrifier scored 39.6 against the baseline's 39.0: a twin that
learns nothing teaches nothing."""

from __future__ import annotations

import math

import pytest
import yaml

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.probe import study_plan
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.shipped import shipped_names, shipped_space
from lm_tuner.tuner.store.studies import get_study
from lm_tuner.tuner.store.trials import top_trials

SMALL = [*(name for name in shipped_names() if name.startswith("small/")), "quickstart"]
MARGIN = 0.9  # the best validation perplexity is at most 90% of the unigram baseline's


@pytest.mark.parametrize("name", SMALL)
def test_a_small_space_plans_without_warnings(name):
    """What `tuner plan` (without its probe), `tuner launch` and POST /studies warn about before the first trial."""
    planned = study_plan(parse_spec(shipped_space(name).text), probe=False)
    assert planned.warnings == [] and planned.notes == []


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL)
def test_a_small_space_runs_without_warnings_and_beats_its_unigram_baseline(name, ray_cluster, sqlite_url, tmp_path):
    """The space's first trials, as many as run at once (its points, priors or first draws: every twin's trials, the
    demo's first of each family), with its schedule as shipped; the later stages are left out (reruns train as the
    tuning trials do; tests/test_spaces.py runs every stage of a twin). What the run warned about is stored with the
    study (the launch prints the same lines); the best of each family is scored against the corpus's unigram
    perplexity."""
    document = first_wave(shipped_space(name).text)
    spec = parse_spec(document)
    assert launch_study(spec, document, Settings(sqlite_url, tmp_path / "artifacts")) == "complete"
    study = get_study(sqlite_url, spec.name)
    assert study.warnings == []
    for family in spec.families:
        (best,) = top_trials(sqlite_url, spec.name, family, "tune", 1)
        assert math.exp(best.value) < MARGIN * study.unigram_perplexity, (family, math.exp(best.value),
                                                                          study.unigram_perplexity)


def first_wave(document: str) -> str:
    """The space with as many trials per family as fill its concurrency once, and no stage after tuning."""
    space = yaml.safe_load(document)
    tuning = space["tuning"]
    tuning["trials"] = min(tuning["trials"], math.ceil(tuning["concurrency"] / len(space["families"])))
    for stage in ("reruns", "evaluation", "dynamic_evaluation"):
        space.pop(stage, None)
    return yaml.safe_dump(space, sort_keys=False)
