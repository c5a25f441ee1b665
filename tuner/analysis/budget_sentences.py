"""What a comparison says in words about budgets: who wins at equal tokens and at equal compute (and why the two
differ, when they do), what the final models trained on, and what more tuning trials would buy."""

from __future__ import annotations

from collections.abc import Mapping

from lm_tuner.tuner.analysis.compute_account import EQUAL_WITHIN, Axis, EqualBudget, StudyAccount
from lm_tuner.tuner.spec.units import Unit


def amount(axis: Axis, value: float | None, compute_unit: str) -> str:
    """`value` of an axis for a reader: 1.20M tokens, 84.0k tokens, 960 tokens; 2,400 CPU core-seconds; unknown
    (None: not recorded)."""
    if value is None:
        return "unknown"
    return f"{quantity(axis, value)} {'tokens' if axis == 'tokens' else compute_unit}"


def quantity(axis: Axis, value: float | None) -> str:
    """`amount` without its unit: 1.20M, 84.00k, 960; 2,400; unknown."""
    if value is None:
        return "unknown"
    if axis == "compute":
        return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.2f}{suffix}" if value < 100 * size else f"{value / size:,.0f}{suffix}"
    return f"{value:,.0f}"


def budget_sentence(account: StudyAccount, unit: Unit, digits: int, *, provisional: bool) -> str:
    """Who wins at equal tokens and at equal compute, with each family's best there; when the two winners differ,
    that in words with the ratio of their tokens per device-second."""
    if len(account.families) < 2:
        return "one family: nothing to compare at equal budgets"
    tokens, compute = account.tokens, account.compute
    if tokens.winner and compute.winner and tokens.winner != compute.winner:
        rates = {family.family: family.tokens_per_second for family in account.families}
        head = f"{tokens.winner} wins at equal tokens, {compute.winner} at equal compute"
        if rates[tokens.winner] and rates[compute.winner]:
            head += (f": {tokens.winner} trains at {rates[tokens.winner] / rates[compute.winner]:.2f}x "
                     f"{compute.winner}'s tokens per {account.compute_unit.removesuffix('s')}")
    elif tokens.winner and tokens.winner == compute.winner:
        head = f"{tokens.winner} wins at equal tokens and at equal compute"
    else:
        head = "; ".join(_one_axis(budget) for budget in (tokens, compute))
    details = [_scores(budget, account.compute_unit, unit, digits) for budget in (tokens, compute)
               if budget.point is not None]
    said = head + (f" ({'; '.join(details)})" if details else "")
    return f"so far (the study runs): {said}" if provisional else said


def _one_axis(budget: EqualBudget) -> str:
    if budget.winner:
        return f"{budget.winner} wins at equal {budget.axis}"
    return f"no winner at equal {budget.axis}: {budget.none_because}"


def _scores(budget: EqualBudget, compute_unit: str, unit: Unit, digits: int) -> str:
    """'at 1.20M tokens each: mogrifier 87.80, lstm 93.60', best first; a family without a score last."""
    ranked = sorted(budget.best.items(), key=lambda item: (item[1] is None, item[1] or 0.0))
    scores = ", ".join(f"{family} {'no score' if loss is None else f'{unit.of(loss):.{digits}f}'}"
                       for family, loss in ranked)
    return f"at {amount(budget.axis, budget.point, compute_unit)} each: {scores}"


def final_models_budget(tokens: Mapping[str, float | None], compute: Mapping[str, float | None],
                        compute_unit: str) -> str:
    """What each family's final models trained on (means per model), and whether that is equal across families
    (within EQUAL_WITHIN): the budget a winner named by them holds under."""
    if any(value is None for value in (*tokens.values(), *compute.values())):
        return "a budget not recorded (final models trained before the compute account was kept)"
    return f"{_spread('tokens', tokens, compute_unit)} and {_spread('compute', compute, compute_unit)} per model"


def _spread(axis: Axis, values: Mapping[str, float], compute_unit: str) -> str:
    low, high = min(values, key=values.get), max(values, key=values.get)
    if values[high] <= values[low] * (1 + EQUAL_WITHIN):
        return f"equal {axis} ({amount(axis, values[low], compute_unit)} each)"
    return (f"unequal {axis} ({amount(axis, values[low], compute_unit)} for {low} to "
            f"{amount(axis, values[high], compute_unit)} for {high})")


def more_trials_sentence(values: Mapping[str, list[float]], unit: Unit, digits: int) -> str:
    """What twice the tuning trials would buy each family by its tuning curve (the expected best after n trials,
    Dodge et al. 2019, from its complete tuning trials' losses): an estimate from the trials run, so it never goes
    below the best of them."""
    import numpy as np

    from lm_tuner.tuner.analysis.tuning_curves import expected_best  # opda: only where a verdict needs it

    gains = []
    for family, losses in values.items():
        if not losses:
            continue
        n = len(losses)
        now, doubled = expected_best(unit.convert(np.asarray(losses)), np.array([n, 2 * n]))
        gains.append(f"{family} from {now:.{digits}f} to {doubled:.{digits}f} (n = {n} → {2 * n})")
    if not gains:
        return "no family has complete tuning trials to draw a tuning curve from"
    return (f"by the tuning curves (expected best after n trials, from the trials run, so never below the best of "
            f"them; `tuner curves`), twice the tuning trials would take {', '.join(gains)}")
