"""Reruns: rerun r of every family (and of every top configuration) trains with the same seed, never a tuning seed,
so the final models the families are compared on differ only in their configurations."""

from __future__ import annotations

from pathlib import Path

from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.space import RERUN_SEED_OFFSET, rerun_seed, trial_seed
from tests.conftest import TINY_SPEC


def test_rerun_r_has_one_seed_for_every_family_and_never_a_tuning_one():
    spec = parse_spec({**TINY_SPEC, "tuning": {**TINY_SPEC["tuning"], "seed": 7, "trials": 1_000_000},
                       "reruns": {"top": 2, "seeds": 3}})
    seeds = [rerun_seed(spec, repeat) for repeat in range(spec.reruns.seeds)]
    assert seeds == [7 + RERUN_SEED_OFFSET, 7 + 2 * RERUN_SEED_OFFSET, 7 + 3 * RERUN_SEED_OFFSET]
    tuning = {trial_seed(spec, 0), trial_seed(spec, spec.tuning.trials - 1)}  # the least and the greatest
    assert all(seed > max(tuning) for seed in seeds)


def test_the_seeds_section_of_the_spec_reference_says_so():
    text = " ".join((Path(__file__).parents[1] / "docs" / "spec.md").read_text().split())
    assert "seed `tuning.seed + 1,000,000 × (r + 1)`" in text and "+ k`, a seed no tuning" not in text
