"""A compute-budgeted study's plan on this machine: each family's speed from the probe (or, where the probe cannot
run here, a FLOP count at the speed measured on a machine of this kind), split into rungs by
tuner.spec.budget_plan. The plan is fixed when the study first runs and stored with it (`lmt_studies.plan`): a
continued study keeps its rungs whatever this machine's speed is by then."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from lm_tuner.tuner.run.machine import this_machine
from lm_tuner.tuner.run.probe import PROBE_SECONDS, study_plan
from lm_tuner.tuner.run.study_data import corpus_size
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.budget_plan import family_speeds, plan_budget
from lm_tuner.tuner.spec.cost import counted_speed
from lm_tuner.tuner.spec.estimate import ProbeTiming, parallel_trials
from lm_tuner.tuner.spec.plan import BudgetPlan
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord

PLAN_PROBE_SECONDS = PROBE_SECONDS
"""How long a study's first run probes this machine for its plan."""


def measured_budget_plan(spec: StudySpec, *, slots: int | None = None, seconds: float | None = None,
                         probing: Callable[[], None] | None = None) -> BudgetPlan:
    """Probe this machine (or, where the probe cannot run, count FLOPs) and split the budget: BudgetTooSmall where
    it buys too little. `slots`: trials at a time, where not as many as this machine runs (a Ray cluster)."""
    timings: dict[str, ProbeTiming] = {}
    planned = study_plan(spec, probe=True, seconds=seconds or PLAN_PROBE_SECONDS, probing=probing,
                         probed=lambda family, timing, _seconds: timings.__setitem__(family, timing))
    machine = this_machine()
    if timings:
        measured = "timed here by the probe"
    else:
        speed = counted_speed(spec, planned, machine)
        timings, measured = dict(speed.timings), speed.said
    return plan_budget(spec, family_speeds(spec, timings, corpus_size(spec).valid_tokens),
                       slots or parallel_trials(spec, machine), measured=measured)


def stored_budget_plan(url: str, name: str) -> BudgetPlan | None:
    with sessions(url)() as session:
        stored = session.scalar(select(StudyRecord.plan).where(StudyRecord.name == name))
    return None if stored is None else BudgetPlan.model_validate(stored)


def fixed_budget_plan(url: str, spec: StudySpec, *, slots: int | None = None,
                      probing: Callable[[], None] | None = None) -> BudgetPlan:
    """The study's stored plan, else one measured now and stored (the first run of the study)."""
    stored = stored_budget_plan(url, spec.name)
    if stored is not None:
        return stored
    plan = measured_budget_plan(spec, slots=slots, probing=probing)
    with sessions(url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == spec.name))
        if record.plan is None:  # another process may have stored one meanwhile: the first one stands
            record.plan = plan.model_dump(mode="json")
    return stored_budget_plan(url, spec.name) or plan


def top_rung_steps(spec: StudySpec, url: str, family: str) -> int | None:
    """How far a rerun or sensitivity run of the family trains under a compute budget: as far as its finalists (the
    top rung of the stored plan); None without one (the schedule's own budget decides)."""
    if spec.compute_budget is None:
        return None
    plan = stored_budget_plan(url, spec.name)
    return None if plan is None else plan.family(family).top_steps
