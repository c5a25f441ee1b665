"""Each family's trials per stage, counted in one SQL query: what `tuner status`, `tuner compare` and the live
progress of `launch` show per family, and how many reruns a family is owed (as tuner.store.progress plans them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select

from lm_tuner.tuner.store.engine import reading, retried_on_disconnect
from lm_tuner.tuner.store.schema import TrialRecord
from lm_tuner.tuner.store.views import SETTLED_STATES


@dataclass(frozen=True)
class FamilyTally:
    """One family's trials of one stage. Interrupted trials (failed when their controller stopped, run again on
    resume) count in none of the outcomes, as the controller counts them, but in `interrupted`."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    best_value: float | None = None  # lowest validation loss of its complete trials
    interrupted: int = 0

    @property
    def settled(self) -> int:
        return self.complete + self.pruned + self.failed


Tallies = dict[tuple[str, str], FamilyTally]
"""Keyed by (family, stage); a pair without trials is absent."""


@retried_on_disconnect
def family_tallies(url: str, name: str) -> Tallies:
    kept = TrialRecord.interrupted.is_(False)
    query = (select(TrialRecord.family, TrialRecord.stage,
                    func.count().filter(and_(TrialRecord.state == "COMPLETE", kept)).label("complete"),
                    func.count().filter(and_(TrialRecord.state == "PRUNED", kept)).label("pruned"),
                    func.count().filter(and_(TrialRecord.state == "FAIL", kept)).label("failed"),
                    func.count().filter(TrialRecord.state == "RUNNING").label("running"),
                    func.min(TrialRecord.value).filter(TrialRecord.state == "COMPLETE").label("best_value"),
                    func.count().filter(TrialRecord.interrupted.is_(True)).label("interrupted"))
             .where(TrialRecord.study_name == name, TrialRecord.state.in_((*SETTLED_STATES, "RUNNING")))
             .group_by(TrialRecord.family, TrialRecord.stage))
    with reading(url) as connection:
        return {(row.family, row.stage): FamilyTally(row.complete, row.pruned, row.failed, row.running,
                                                     row.best_value, row.interrupted)
                for row in connection.execute(query)}


def tally(tallies: Tallies, family: str, stage: str) -> FamilyTally:
    return tallies.get((family, stage), FamilyTally())


@dataclass(frozen=True)
class RerunCount:
    planned: int
    finished: int  # settled: complete, pruned or failed (never more than planned)


def rerun_counts(spec: dict[str, Any], tallies: Tallies) -> dict[str, RerunCount]:
    """Per family, the reruns planned and finished, planned as tuner.store.progress plans them: `top` × `seeds`
    until tuning is done, then `seeds` for each of the family's complete tuning trials, at most `top` of them.
    Empty when the spec asks for no reruns."""
    reruns = spec.get("reruns")
    if not reruns:
        return {}
    families = spec["families"]
    most = reruns["top"] * reruns["seeds"]
    tuned = sum(tally(tallies, family, "tune").settled for family in families)
    tuning_done = tuned >= spec["tuning"]["trials"] * len(families)
    counts = {}
    for family in families:
        settled = tally(tallies, family, "rerun").settled
        planned = most
        if tuning_done and settled < most:
            planned = reruns["seeds"] * min(reruns["top"], tally(tallies, family, "tune").complete)
        counts[family] = RerunCount(planned, min(settled, planned))
    return counts
