"""The README's own-corpus study is the one benchmarks/study_vs_single_run.py measures (issue 40: the benchmark's study
is written as the README recommends), and it is a valid spec with a compute budget."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from benchmarks.study_vs_single_run import study_spec
from lm_tuner.tuner.spec import parse_spec

README = Path(__file__).resolve().parents[1] / "README.md"
SAME_STUDY = ("families", "parameter_budget", "compute_budget", "training", "fixed", "search_space", "tuning",
              "resources")


def readme_study() -> dict:
    section = README.read_text().split("## Your own corpus", 1)[1]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))


def test_the_readme_recommends_the_study_the_benchmark_measures():
    recommended = readme_study()
    measured = study_spec(recommended["compute_budget"]["wall_minutes"])
    assert {key: recommended[key] for key in SAME_STUDY} == {key: measured[key] for key in SAME_STUDY}


def test_the_readme_study_is_valid_and_lets_its_budget_decide_the_trials():
    spec = parse_spec(readme_study())
    assert spec.compute_budget is not None and spec.tuning.trials == spec.compute_budget.configurations == 3
    assert spec.tuning.priors
