"""What `tuner compare` prints: the families side by side, each column saying which validation it is on, their
tuning at equal tokens and at equal compute, the unigram baseline of the corpus, and the winner with the budget it
holds under (or why there is none)."""

from __future__ import annotations

import math

from lm_tuner.tuner.analysis.budget_sentences import amount, quantity
from lm_tuner.tuner.analysis.comparison import Comparison, Estimate, FamilyResult
from lm_tuner.tuner.analysis.study_facts import Baseline, baseline_warning
from lm_tuner.tuner.cli.common import PlainTable, console, unclipped

TRAINING_MARK = "†"  # a validation score from training (the tuning score), not from the test protocol


def print_comparison(found: Comparison, baseline: Baseline) -> None:
    digits = 3 if found.unit == "bpc" else 2
    over = "mean ± sd over the reruns" if found.has_reruns else \
        "single tuning runs (no reruns in the spec: no mean over seeds)"
    provisional = " — provisional: the study is still running" if found.provisional else ""

    def cell(estimate: Estimate | None, row: FamilyResult | None = None) -> str:
        if estimate is None:
            return "-"
        spread = f" ± {estimate.std:.{digits}f}" if estimate.count > 1 else ""
        mark = f" {TRAINING_MARK}" if row is not None and row.valid_from == "training" else ""
        return f"{estimate.mean:.{digits}f}{spread} (n={estimate.count}){mark}"

    def best(row: FamilyResult) -> str:
        if row.best_tuning is None:
            return "no result yet"
        full = "" if row.best_tuning_full is None else f"; full {row.best_tuning_full:.{digits}f}"
        return f"{row.best_tuning:.{digits}f}{full}"

    columns = {f"best tuning run (val, {found.tuning_validation})": best,
               **({"reruns finished": lambda row: f"{row.reruns_finished}/{row.reruns_planned}"}
                  if found.has_reruns else {}),
               "val (full)": lambda row: cell(row.valid, row)}
    later = {"test": "test", "MC val (full)": "mc_valid", "MC test": "mc_test", "dyneval val (full)": "dynamic_valid",
             "dyneval test": "dynamic_test"}
    for header, name in later.items():  # the evaluations the study has made (an empty column says nothing)
        if any(getattr(row, name) is not None for row in found.families):
            columns[header] = lambda row, name=name: cell(getattr(row, name))
    if any(row.reversed_loss is not None for row in found.families):  # a reverse-copy task: memory, measured
        columns["reversed half: loss"] = lambda row: _mean(row.reversed_loss, "{:.3f}")
        columns["accuracy"] = lambda row: _mean(row.reversed_accuracy, "{:.1%}")
    table = PlainTable("family", *columns, title=f"{found.study}: {found.unit}, {over}{provisional}")
    for row in found.families:
        table.add_row(row.family, *(show(row) for show in columns.values()))
    console.print(unclipped(table))
    notes = ["n: the final models (seeds) a mean is over"]
    if any(header.startswith(("MC", "dyneval")) for header in columns):
        notes.append("MC: Monte-Carlo dropout; dyneval: dynamic evaluation")
    if "accuracy" in columns:
        notes.append("reversed half: the second half of each reverse-copy example, predicted from memory alone; its "
                     "loss (nats per token) and the share of its symbols predicted, at each model's best turn")
    if any(row.valid_from == "training" for row in found.families):
        notes.append(f"{TRAINING_MARK}: validation ({found.tuning_validation}) as scored during training; the test "
                     f"protocol has not scored these models")
    for note in notes:
        console.print(note, style="dim", markup=False)
    if baseline.loss is None:
        console.print(f"unigram baseline: unknown ({baseline.unknown_because})", markup=False)
    else:
        score = baseline.loss / math.log(2) if found.unit == "bpc" else baseline.perplexity
        console.print(f"unigram baseline: {score:.{digits}f} {found.unit} on validation (word frequencies alone)")
    print_budgets(found, digits)
    if found.winner:
        console.print(f"winner: [bold]{found.winner}[/bold] at {found.winner_holds_at} (by the {found.winner_by})",
                      highlight=False)
        if found.margin is not None:
            console.print(found.margin.sentence(found.unit), markup=False)
    else:
        console.print(found.verdict, style="yellow", markup=False)
    console.print(f"at equal budgets: {found.budget_verdict}", markup=False)
    warning = baseline_warning(found.no_better_than(baseline))
    if warning:
        console.print(f"warning: {warning}", style="yellow", markup=False)


def print_budgets(found: Comparison, digits: int) -> None:
    """Each family's tuning account: what it spent, how fast it trains, and its best at the equal points."""
    per = found.compute_unit.removesuffix("s")

    def best(score: float | None) -> str:
        return "-" if score is None else f"{score:.{digits}f}"

    tokens = amount("tokens", found.equal_tokens, found.compute_unit)
    compute = amount("compute", found.equal_compute_seconds, found.compute_unit)
    table = PlainTable("family", "tokens", found.compute_unit, f"tokens per {per}",
                       f"best at equal tokens ({tokens})", f"best at equal compute ({compute})",
                       title=f"tuning at equal budgets ({found.unit}; every turn of the tuning trials so far)")
    for row in found.families:
        rate = "-" if row.tokens_per_second is None else f"{row.tokens_per_second:,.0f}"
        table.add_row(row.family, quantity("tokens", row.tokens), quantity("compute", row.compute_seconds), rate,
                      best(row.best_at_equal_tokens), best(row.best_at_equal_compute))
    console.print(unclipped(table))


def _mean(estimate: Estimate | None, number: str) -> str:
    """`estimate` as `number` formats a value: mean ± sd (n), or "-"."""
    if estimate is None:
        return "-"
    spread = f" ± {number.format(estimate.std)}" if estimate.count > 1 else ""
    return f"{number.format(estimate.mean)}{spread} (n={estimate.count})"
