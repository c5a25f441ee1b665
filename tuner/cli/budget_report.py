"""How a compute budget will be spent, as `tuner plan` and the launch's header show it: per family and rung, the
configurations, the steps and tokens each trains to, and the family's tokens, compute and speed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lm_tuner.tuner.cli.common import PlainTable, console

if TYPE_CHECKING:
    from lm_tuner.tuner.spec.budget_plan import BudgetPlan


def print_budget(plan: BudgetPlan) -> None:
    from lm_tuner.tuner.spec.cost import duration

    unit = "GPU-h" if plan.device_unit == "GPU-hours" else "core-h"
    console.print(f"budget: {plan.amount:g} {plan.unit}, the same {plan.equal} for every family; successive halving "
                  f"at reduction factor {plan.reduction_factor}, rungs in training tokens (speeds {plan.measured})",
                  markup=False)
    rungs = len(plan.families[0].rungs)
    same_steps = len({tuple(rung.steps for rung in family.rungs) for family in plan.families}) == 1
    table = PlainTable("family", *(f"rung {k}" for k in range(rungs)), "tokens", unit, "tokens/s",
                       title="configurations x tokens each is trained to, per rung", title_justify="left")
    for family in plan.families:
        table.add_row(family.family,
                      *(f"{rung.configurations} x {tokens(rung.tokens)}" + ("" if same_steps else f" ({rung.steps:,})")
                        for rung in family.rungs),
                      tokens(family.tokens), f"{family.device_seconds / 3600:.3g}", f"{family.tokens_per_second:,.0f}")
    console.print(table)
    if same_steps:
        ends = " / ".join(f"{rung.steps:,}" for rung in plan.families[0].rungs)
        console.print(f"rungs end at {ends} steps of {plan.tokens_per_step:,} tokens", markup=False)
    reruns = f", then {plan.reruns} rerun(s) per family as long as a finalist" if plan.reruns else ""
    console.print(f"configurations per family: {plan.families[0].rungs[0].configurations}{reruns}; expected end: "
                  f"about {duration(plan.expected_seconds)} with {plan.parallel_trials} trial(s) at a time",
                  markup=False)


def budget_line(plan: BudgetPlan) -> str:
    """The split in one line, as a launch's header shows it."""
    from lm_tuner.tuner.spec.cost import duration

    families = "; ".join(
        f"{family.family} " + ", ".join(f"{rung.configurations} to {tokens(rung.tokens)}" for rung in family.rungs)
        + f" tokens ({tokens(family.tokens)} in all)" for family in plan.families)
    return (f"budget: {plan.amount:g} {plan.unit}, the same {plan.equal} per family: {families}; expected end about "
            f"{duration(plan.expected_seconds)}")


def tokens(count: int) -> str:
    """A token count as a person reads it: 950, 12.3k, 4.56M, 1.2B."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)
