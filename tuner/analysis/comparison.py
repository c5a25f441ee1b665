"""The result of a study as a comparison of its families: the Table 2.1 of the paper, from the database.

Per family: the best tuning run, then — over the final models (the reruns with new seeds, else the
best tuning run) — validation and test with and without Monte-Carlo dropout and dynamic
evaluation, as mean ± standard deviation; and the family's tuning at equal training tokens and at equal
compute, from the study's compute account (tuner.analysis.compute_account). The winner is the family with
the lowest mean validation score of its final models, never the luckiest single run, named only once those
are all in (every planned rerun of every family finished, and scored by the test protocol where the spec asks
for it), only where the study compares two families or more, and only where the seeds separate it from the
runner-up: the 95% interval of the difference of their means (Welch's t) excludes 0; otherwise there is no
clear winner at this budget, and the verdict says what the tuning curves expect more trials to buy. A spec
without reruns compares single tuning runs, which are the tuning account's own scores: its winner must also be
the winner at equal tokens and at equal compute (where the account knows them), and no interval can be drawn.
The verdict says which budget the winner holds under (docs/methodology.md, "The comparison").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select

from lm_tuner.tuner.analysis.budget_sentences import (
    amount,
    budget_sentence,
    final_models_budget,
    more_trials_sentence,
)
from lm_tuner.tuner.analysis.compute_account import StudyAccount, study_account
from lm_tuner.tuner.analysis.family_tallies import FamilyTally, RerunCount, family_tallies, rerun_counts, tally
from lm_tuner.tuner.analysis.study_facts import (
    Baseline,
    is_provisional,
    no_better_than_baseline,
    validation_label,
    validation_tokens,
)
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord
from lm_tuner.tuner.store.trials import final_trials, top_trials

KINDS = ("deterministic", "mc", "dynamic", "dynamic_mc")


@dataclass(frozen=True)
class Estimate:
    mean: float
    std: float  # sample standard deviation; 0 for a single value
    count: int


@dataclass(frozen=True)
class Lineage:
    """Which stage-2 trial's settings gave a checkpoint's dynamic-evaluation result."""

    checkpoint_trial_id: int
    dyneval_trial_id: int | None
    settings: dict


@dataclass(frozen=True)
class FamilyResult:
    family: str
    complete_tuning_trials: int
    best_tuning: float | None
    final_trial_ids: list[int]
    valid: Estimate | None = None
    test: Estimate | None = None
    mc_valid: Estimate | None = None
    mc_test: Estimate | None = None
    dynamic_valid: Estimate | None = None
    dynamic_test: Estimate | None = None
    lineage: list[Lineage] = field(default_factory=list)
    best_tuning_full: float | None = None  # the best tuning run on the whole validation split, once rescored
    # where `valid` comes from: "test protocol", "full rescoring" (the whole validation split, scored after tuning
    # where turns scored a subset), "training" (the score during training), None: no result yet
    valid_from: str | None = None
    reruns_planned: int | None = None  # None: the spec asks for no reruns
    reruns_finished: int | None = None
    # reverse-copy tasks: over the final models, the best turn's loss (nats/token) and accuracy on the reversed
    # halves, the part that measures memory; None for other corpora
    reversed_loss: Estimate | None = None
    reversed_accuracy: Estimate | None = None
    # the family's tuning account (every turn of its tuning trials so far): None where turns were recorded without it
    tokens: int | None = None  # training tokens
    compute_seconds: float | None = None  # CPU core-seconds or GPU-seconds (Comparison.compute_unit)
    tokens_per_second: float | None = None  # training tokens per CPU core-second or GPU-second
    best_at_equal_tokens: float | None = None  # the best validation score of its tuning at Comparison.equal_tokens
    best_at_equal_compute: float | None = None  # and at Comparison.equal_compute_seconds
    final_tokens: float | None = None  # training tokens of its final models, mean per model
    final_compute_seconds: float | None = None  # their device-seconds, mean per model
    stopped_tuning_trials: int = 0  # tuning trials stopped early: pruned, or left at a lower rung of a compute budget


@dataclass(frozen=True)
class Margin:
    """How far the winner is ahead of the runner-up on the score that named it: the difference of their means (the
    runner-up's less the winner's, lower being better) with its 95% interval by Welch's t over their seeds, where
    one can be drawn (two seeds or more of each family, with some spread); else `low` and `high` are None."""

    runner_up: str
    difference: float
    low: float | None
    high: float | None
    seeds: tuple[int, int]  # the winner's and the runner-up's final models

    @property
    def separated(self) -> bool:
        """Whether the interval excludes no difference at all: the seeds' spread does not explain the margin."""
        return self.low is not None and self.low > 0

    def sentence(self, unit: str) -> str:
        ahead = f"ahead of {self.runner_up} by {self.difference:.3f} {unit}"
        if self.low is None:
            seeds = "one seed each" if self.seeds == (1, 1) else f"{self.seeds[0]} and {self.seeds[1]} seeds"
            return (f"{ahead} ({seeds}): no interval of the difference can be drawn (Welch's t needs two seeds or "
                    f"more of each, with some spread), so nothing here measures whether other seeds would keep "
                    f"this order")
        said = "the seeds separate them" if self.separated else "the seeds do not separate them"
        return (f"{ahead}, 95% interval of the difference {self.low:.3f} to {self.high:.3f} (Welch's t over the "
                f"seeds): {said}")


def margin(winner: Estimate, runner_up: Estimate, runner_up_family: str) -> Margin:
    """The winner's margin over the runner-up, its interval left out where either mean has fewer than two seeds or
    neither has any spread (none can be drawn)."""
    difference = runner_up.mean - winner.mean
    seeds = (winner.count, runner_up.count)
    shares = (winner.std ** 2 / winner.count, runner_up.std ** 2 / runner_up.count)
    if min(seeds) < 2 or sum(shares) == 0:
        return Margin(runner_up_family, difference, None, None, seeds)
    from scipy.stats import t as students_t  # 0.3 s to import: only where an interval is drawn

    freedom = sum(shares) ** 2 / (shares[0] ** 2 / (winner.count - 1) + shares[1] ** 2 / (runner_up.count - 1))
    half_width = float(students_t.ppf(0.975, freedom)) * math.sqrt(sum(shares))
    return Margin(runner_up_family, difference, difference - half_width, difference + half_width, seeds)


@dataclass(frozen=True)
class Comparison:
    study: str
    unit: str  # "perplexity" (words) or "bpc" (characters)
    families: list[FamilyResult]
    winner: str | None
    winner_by: str
    status: str = ""
    provisional: bool = False  # the study still runs: every number can change
    has_reruns: bool = False
    reruns_planned: int = 0
    reruns_finished: int = 0
    tuning_validation: str = "full"  # which validation set the tuning scores are on, e.g. "subset of 2,000 tokens"
    verdict: str = ""  # the winner, the budget it holds under and why, or why there is none (yet)
    margin: Margin | None = None  # the leader's over the runner-up, where the final models have both
    winner_holds_at: str | None = None  # the budget the winner was measured at (equal tokens, equal compute)
    compute_unit: str = "CPU core-seconds"  # or "GPU-seconds": what the study's trials ran on
    equal_tokens: int | None = None  # the least training tokens any family's tuning spent (None: unknown)
    equal_compute_seconds: float | None = None  # the least device-seconds any family's tuning spent
    winner_at_equal_tokens: str | None = None  # the family with the best tuning score at equal_tokens
    winner_at_equal_compute: str | None = None  # and at equal_compute_seconds
    budget_verdict: str = ""  # both in words: who wins at which budget, and why the two differ where they do

    def no_better_than(self, baseline: Baseline) -> list[str]:
        """The families whose validation score (of the final models, else of the best tuning run) does not beat the
        unigram baseline."""
        def loss(row: FamilyResult) -> float | None:
            score = row.valid.mean if row.valid is not None else row.best_tuning
            if score is None:
                return None
            return score * math.log(2) if self.unit == "bpc" else math.log(score)

        return no_better_than_baseline(baseline, {row.family: loss(row) for row in self.families})


def comparison_document(found: Comparison, baseline: Baseline) -> dict[str, Any]:
    """The comparison as `tuner compare --json` prints it and the API returns it: with the unigram baseline of the
    corpus, and the families that do not beat it."""
    return asdict(found) | {"unigram_baseline": asdict(baseline),
                            "no_better_than_baseline": found.no_better_than(baseline)}


def comparison(url: str, name: str) -> Comparison | None:
    with sessions(url)() as session:
        found = session.execute(select(StudyRecord.spec, StudyRecord.status).where(StudyRecord.name == name)).first()
    if found is None:
        return None
    spec_data, status = found
    spec = StudySpec.model_validate(spec_data)
    unit = unit_of(spec_data)
    convert = unit.of
    account = study_account(url, name)
    tallies = family_tallies(url, name)
    reruns = rerun_counts(spec_data, tallies)
    results = [_family_result(url, spec, family, convert, tally(tallies, family, "tune"), reruns.get(family),
                              account) for family in spec.families]
    label = validation_label(spec_data)
    winner_by = _winner_by(spec, unit.name, label)
    digits = 3 if spec.character_level else 2
    provisional = is_provisional(status)
    leader, verdict = _verdict(spec, tallies, reruns, results, finished=not provisional,
                               subset=validation_tokens(spec_data) is not None)
    ahead = _winners_margin(results, leader)
    winner, verdict, holds_at = _judged(url, spec, leader, verdict, ahead, results, account, unit, winner_by)
    return Comparison(name, unit.name, results, winner, winner_by, status=status, provisional=provisional,
                      has_reruns=spec.reruns is not None, reruns_planned=sum(c.planned for c in reruns.values()),
                      reruns_finished=sum(c.finished for c in reruns.values()), tuning_validation=label,
                      verdict=verdict, margin=ahead, winner_holds_at=holds_at, compute_unit=account.compute_unit,
                      equal_tokens=None if account.tokens.point is None else int(account.tokens.point),
                      equal_compute_seconds=account.compute.point, winner_at_equal_tokens=account.tokens.winner,
                      winner_at_equal_compute=account.compute.winner,
                      budget_verdict=budget_sentence(account, unit, digits, provisional=provisional))


def _judged(url: str, spec: StudySpec, leader: str | None, pending: str, ahead: Margin | None,
            results: list[FamilyResult], account: StudyAccount, unit: Unit, winner_by: str
            ) -> tuple[str | None, str, str | None]:
    """The winner, the verdict and the budget the winner holds under: the final models' leader, named where the study
    compares families, the seeds do not leave it in doubt and (without reruns) the tuning account agrees."""
    if len(spec.families) < 2:
        return None, f"one family ({spec.families[0]}): nothing to compare it with, so no winner", None
    if leader is None:
        return None, pending, None
    if ahead is not None and ahead.low is not None and not ahead.separated:
        digits = 3 if spec.character_level else 2
        return None, (f"no clear winner at this budget: {leader} is {ahead.sentence(unit.name)}; "
                      f"{more_trials_sentence(_tuning_losses(url, spec), unit, digits)}"), None
    if spec.reruns is None:  # single tuning runs: the account's own scores, so its winners must agree
        against = [budget for budget in (account.tokens, account.compute) if budget.winner not in (None, leader)]
        if against:
            others = ", ".join(f"{budget.winner} at equal {budget.axis}" for budget in against)
            return None, (f"no winner: {leader} has the best single tuning run, but the tuning account favours "
                          f"{others} (no reruns in the spec to settle it)"), None
        holds_at = _tuning_budget(account)
    else:
        holds_at = final_models_budget({r.family: r.final_tokens for r in results},
                                       {r.family: r.final_compute_seconds for r in results}, account.compute_unit)
    verdict = f"winner: {leader} at {holds_at}, by the {winner_by}"
    return leader, verdict + (f"; {ahead.sentence(unit.name)}" if ahead else ""), holds_at


def _tuning_budget(account: StudyAccount) -> str:
    """The equal budgets at which the tuning account names the winner, or why it names it at none."""
    held = [f"equal {budget.axis} ({amount(budget.axis, budget.point, account.compute_unit)} each)"
            for budget in (account.tokens, account.compute) if budget.winner]
    if held:
        return " and ".join(held) + " in tuning"
    return "a budget not compared (" + "; ".join(f"at equal {budget.axis}: {budget.none_because}"
                                                  for budget in (account.tokens, account.compute)) + ")"


def _tuning_losses(url: str, spec: StudySpec) -> dict[str, list[float]]:
    """Each family's complete tuning trials' validation losses, as its tuning curve is drawn from."""
    with sessions(url)() as session:
        rows = session.execute(select(TrialRecord.family, TrialRecord.value).where(
            TrialRecord.study_name == spec.name, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE",
            TrialRecord.interrupted.is_(False), TrialRecord.value.is_not(None))).all()
    return {family: [value for owner, value in rows if owner == family] for family in spec.families}


def _winners_margin(results: list[FamilyResult], winner: str | None) -> Margin | None:
    others = [r for r in results if r.valid is not None and r.family != winner]
    if winner is None or not others:
        return None
    runner_up = min(others, key=lambda r: r.valid.mean)
    return margin(next(r.valid for r in results if r.family == winner), runner_up.valid, runner_up.family)


def _winner_by(spec: StudySpec, unit: str, label: str) -> str:
    if spec.evaluation is not None:
        score = f"full-validation {unit} (test protocol)"
    elif label != "full":
        score = f"full-validation {unit} (rescored after tuning; tuned on a {label})"
    else:
        score = f"validation {unit} as scored during training"
    if spec.reruns is not None:
        return f"mean {score} of the reruns"
    return f"{score} of the best tuning run (no reruns in the spec: single runs, no mean over seeds)"


def _verdict(spec: StudySpec, tallies, reruns: dict[str, RerunCount], results: list[FamilyResult], *,
             finished: bool, subset: bool) -> tuple[str | None, str]:
    """The family whose final models lead, or None and the reason there is none (yet, while the study runs)."""
    none = "no winner yet" if not finished else "no winner"
    if spec.reruns is None:
        planned = spec.tuning.trials * len(spec.families)
        settled = min(sum(tally(tallies, family, "tune").settled for family in spec.families), planned)
        if settled < planned:
            return None, (f"{none}: {settled} of {planned} tuning trials finished (the spec has no reruns: the "
                          f"comparison is of single tuning runs)")
    else:
        planned, settled = sum(c.planned for c in reruns.values()), sum(c.finished for c in reruns.values())
        if settled < planned:
            return None, f"{none}: {settled} of {planned} reruns finished"
    if spec.evaluation is not None:
        finals = sum(len(result.final_trial_ids) for result in results)
        scored = sum(result.valid.count for result in results if result.valid_from == "test protocol")
        if scored < finals:
            return None, f"{none}: the test protocol has scored {scored} of {finals} final models"
    elif subset:
        finals = sum(len(result.final_trial_ids) for result in results)
        scored = sum(result.valid.count for result in results if result.valid_from == "full rescoring")
        if scored < finals:
            return None, f"{none}: {scored} of {finals} final models scored on the full validation set"
    scores = [(result.valid.mean, result.family) for result in results if result.valid is not None]
    if not scores:
        return None, "no winner: no family has a complete final model"
    return min(scores)[1], ""


def _family_result(url: str, spec: StudySpec, family: str, convert, tuning: FamilyTally,
                   reruns: RerunCount | None, account: StudyAccount) -> FamilyResult:
    finals = final_trials(url, spec.name, family, reruns=spec.reruns is not None)
    best = top_trials(url, spec.name, family, "tune", 1)
    with sessions(url)() as session:
        evaluations = session.scalars(select(EvaluationRecord).where(
            EvaluationRecord.trial_id.in_([t.trial_id for t in finals]))).all()
    by_kind: dict[str, list[EvaluationRecord]] = {kind: [] for kind in KINDS}
    for evaluation in evaluations:
        by_kind[evaluation.kind].append(evaluation)
    estimates = {}
    for kind, prefix in (("deterministic", ""), ("mc", "mc_"), ("dynamic", "dynamic_")):
        records = by_kind[kind]
        estimates[f"{prefix}valid"] = _estimate([convert(r.valid_loss) for r in records])
        estimates[f"{prefix}test"] = _estimate([convert(r.test_loss) for r in records])
    valid_from = "test protocol" if estimates["valid"] is not None else None
    rescored = [t.full_value for t in finals if t.full_value is not None]
    if estimates["valid"] is None and finals and len(rescored) == len(finals):  # tuned on a subset, then rescored
        estimates["valid"], valid_from = _estimate([convert(value) for value in rescored]), "full rescoring"
    if estimates["valid"] is None:  # no test protocol (yet): the training-time validation scores
        estimates["valid"] = _estimate([convert(t.value) for t in finals if t.value is not None])
        valid_from = "training" if estimates["valid"] is not None else None
    lineage = [Lineage(r.trial_id, r.dyneval_trial_id, r.settings.get("dynamic_evaluation", {}))
               for r in by_kind["dynamic"]]
    best_full = best[0].full_value if best else None
    spent = next(spent for spent in account.families if spent.family == family)
    tokens, seconds = spent.total("tokens"), spent.total("compute")
    at_tokens, at_compute = account.tokens.best.get(family), account.compute.best.get(family)
    return FamilyResult(family, tuning.complete, convert(best[0].value) if best else None,
                        [t.trial_id for t in finals], lineage=lineage, valid_from=valid_from,
                        best_tuning_full=None if best_full is None else convert(best_full),
                        reruns_planned=None if reruns is None else reruns.planned,
                        reruns_finished=None if reruns is None else reruns.finished,
                        reversed_loss=_estimate([t.reversed_loss for t in finals if t.reversed_loss is not None]),
                        reversed_accuracy=_estimate([t.reversed_accuracy for t in finals
                                                     if t.reversed_accuracy is not None]),
                        tokens=None if tokens is None else int(tokens), compute_seconds=seconds,
                        stopped_tuning_trials=tuning.pruned,
                        tokens_per_second=spent.tokens_per_second,
                        best_at_equal_tokens=convert(at_tokens), best_at_equal_compute=convert(at_compute),
                        final_tokens=_mean_of([t.tokens for t in finals]),
                        final_compute_seconds=_mean_of([t.compute_seconds for t in finals]),
                        **estimates)


def _estimate(values: list[float]) -> Estimate | None:
    if not values:
        return None
    return Estimate(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


def _mean_of(values: list[float | None]) -> float | None:
    """The mean of values all recorded, else None (some trial trained before the compute account was kept)."""
    if not values or any(value is None for value in values):
        return None
    return statistics.fmean(values)
