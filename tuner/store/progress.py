"""How far a study is: the trials each stage its spec asks for plans, those settled and running, and the time
left. Pure functions of counts read from the database (tuner.results reads them), so the terminal, the API
and the dashboard show one computation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The stages a spec plans, in the order the controller runs them (sensitivity runs are queued apart).
STAGE_LABELS = {"tune": "tuning", "rerun": "reruns", "dyneval": "dynamic evaluation"}


@dataclass(frozen=True)
class StageProgress:
    """One stage of a study: the trials its spec plans, those settled (finished and counted against the
    budget as the controller counts them: an interrupted trial is run again, so it does not count; never
    more than planned), those running, and the time its remaining trials need (None when unknown)."""

    stage: str  # tune, rerun or dyneval
    planned: int
    settled: int
    running: int
    eta_seconds: float | None = None

    @property
    def label(self) -> str:
        return STAGE_LABELS[self.stage]

    @property
    def done(self) -> bool:
        return self.settled >= self.planned

    @property
    def fraction(self) -> float:
        return self.settled / self.planned if self.planned else 1.0


@dataclass(frozen=True)
class StudyProgress:
    """A study's progress over the stages its spec asks for; `eta_seconds` is the current stage's."""

    stages: tuple[StageProgress, ...]

    @property
    def planned(self) -> int:
        return sum(stage.planned for stage in self.stages)

    @property
    def settled(self) -> int:
        return sum(stage.settled for stage in self.stages)

    @property
    def running(self) -> int:
        return sum(stage.running for stage in self.stages)

    @property
    def fraction(self) -> float:
        return self.settled / self.planned if self.planned else 1.0

    @property
    def current(self) -> StageProgress | None:
        """The first stage with trials left, which the controller is running (or would run next)."""
        return next((stage for stage in self.stages if not stage.done), None)

    @property
    def eta_seconds(self) -> float | None:
        current = self.current
        return None if current is None else current.eta_seconds


@dataclass(frozen=True)
class StageTally:
    """Trials of a study's stage (or of one family in it), as the database holds them."""

    settled: int = 0
    running: int = 0
    complete: int = 0


def planned_stages(spec: Mapping[str, Any], tuning: StageTally, later: Mapping[tuple[str, str], StageTally],
                   complete_tuning: Callable[[str, int], int]) -> list[StageProgress]:
    """Each stage the spec asks for with its planned trials, from the tuning trials' tally, the later stages'
    tallies keyed by (stage, family), and `complete_tuning(family, most)`: the family's complete tuning trials,
    counted up to `most` (asked only when the answer can change the plan).

    A later stage takes what the earlier one found once that one is done, as tuner.stages does: reruns
    repeat at most the complete tuning trials of a family, and stage 2 adapts its final checkpoints.
    """
    families = spec["families"]

    def tally(stage: str, family: str) -> StageTally:
        return later.get((stage, family), StageTally())

    def stage(name: str, planned: Mapping[str, int]) -> StageProgress:
        return StageProgress(name, sum(planned.values()),
                             settled=sum(min(tally(name, f).settled, planned[f]) for f in families),
                             running=sum(tally(name, f).running for f in families))

    planned_tuning = spec["tuning"]["trials"] * len(families)
    stages = [StageProgress("tune", planned_tuning, min(tuning.settled, planned_tuning), tuning.running)]
    reruns = spec.get("reruns")
    if reruns:
        most = reruns["top"] * reruns["seeds"]

        def planned_reruns(family: str) -> int:
            if not stages[0].done or tally("rerun", family).settled >= most:  # then it is `most`
                return most
            return reruns["seeds"] * complete_tuning(family, reruns["top"])

        stages.append(stage("rerun", {f: planned_reruns(f) for f in families}))
    dynamic = spec.get("dynamic_evaluation")
    if dynamic:
        most = min(dynamic["top"], reruns["top"] * reruns["seeds"] if reruns else 1)  # final checkpoints

        def checkpoints(family: str) -> int:
            if not all(s.done for s in stages) or tally("dyneval", family).settled >= most * dynamic["trials"]:
                return most
            return min(most, tally("rerun", family).complete if reruns else complete_tuning(family, most))

        stages.append(stage("dyneval", {f: dynamic["trials"] * checkpoints(f) for f in families}))
    return stages


def estimated_seconds_left(mean_duration: float | None, running_elapsed: Sequence[float], remaining: int,
                           concurrency: int) -> float | None:
    """Time until the last of a stage's trials ends if each takes `mean_duration` (that of its finished
    trials; None until one has finished, and then so is the answer): the running ones need what they lack
    of it, and the `remaining` not yet started take the `concurrency` slots as those free up."""
    if mean_duration is None:
        return None
    # A slot frees when its running trial ends; beyond `concurrency` running trials, only the last ones to
    # end free a slot. Every slot frees within one mean, so each takes one trial per round of `remaining`.
    slots = sorted([max(mean_duration - elapsed, 0.0) for elapsed in running_elapsed] + [0.0] * concurrency)
    rounds, extra = divmod(remaining, concurrency)
    return max(free + (rounds + 1 if index < extra else rounds) * mean_duration
               for index, free in enumerate(slots[-concurrency:]))


def budgeted_seconds_left(plan: Mapping[str, Any], trained: Mapping[str, tuple[float, float]]) -> float | None:
    """Time until a compute-budgeted study's tuning ends, from its stored plan (tuner.spec.plan.BudgetPlan) and
    `trained`, each family's tuning tokens so far and the wall-clock seconds its trials took for them: the tokens
    its rungs still lack at the family's own seconds per token (a family yet to report takes the others' mean),
    shared by the plan's trial slots. Its configurations differ in length by rung, so their mean duration would
    say little. None until a trial has reported."""
    rates = {family: seconds / tokens for family, (tokens, seconds) in trained.items() if tokens > 0}
    if not rates:
        return None
    mean_rate = sum(rates.values()) / len(rates)
    left = 0.0
    for family in plan["families"]:
        rungs = family["rungs"]
        # tuner.spec.budget_plan.family_steps in tokens; importing that module would load the heavy modules into
        # the reading commands (tests/test_import_layers.py)
        planned = sum(rung["configurations"] * (rung["tokens"] - (rungs[k - 1]["tokens"] if k else 0))
                      for k, rung in enumerate(rungs))
        done = trained.get(family["family"], (0.0, 0.0))[0]
        left += max(planned - done, 0.0) * rates.get(family["family"], mean_rate)
    return left / max(plan["parallel_trials"], 1)

