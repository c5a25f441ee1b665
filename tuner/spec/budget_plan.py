"""How a study's compute budget is spent: successive halving per family, with rungs in training tokens.

Every family runs the same bracket: `configurations_at(k)` configurations trained to rung k, the best
1/reduction_factor of them promoted to rung k + 1 and trained on from where they stopped, up to the top rung's
finalists. Rung k ends at reduction_factor^-(rungs - 1 - k) of the top rung's steps, rounded to whole turns (a rung
ends on an evaluation). With `equal: tokens` every family gets the same rungs in steps, so the same tokens (all
families of a study train on windows of the same shape); with `equal: compute` each family's rungs are scaled so
that its bracket costs the same device-seconds as every other's.

The top rung's length is what the budget allows once every family's bracket (and its reruns) is paid for at the
family's measured speed: device-seconds per training step and per turn's evaluation (tuner/run/probe.py). The plan
is fixed when the study first runs and stored with it, so a continued study keeps its rungs whatever the machine's
speed is then (docs/methodology.md, "A budget for the whole study").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lm_tuner.tuner.spec.document import ComputeBudget, StudySpec
from lm_tuner.tuner.spec.estimate import ProbeTiming, validation_tokens_per_turn
from lm_tuner.tuner.spec.plan import BudgetPlan, FamilyBudget, Rung


class BudgetTooSmall(ValueError):
    """The budget does not buy one turn at the lowest rung for every family."""


@dataclass(frozen=True)
class FamilySpeed:
    """One family's speed on the machine the plan is for: seconds of one training step and of one turn's evaluation,
    in wall-clock seconds of a trial slot and in device-seconds (CPU core-seconds or GPU-seconds)."""

    family: str
    step_wall: float
    step_device: float
    evaluation_wall: float
    evaluation_device: float


def family_speeds(spec: StudySpec, timings: Mapping[str, ProbeTiming], valid_tokens: int) -> list[FamilySpeed]:
    """Each family's speed from a probe's timing (or one counted from FLOPs): a step, and a turn's evaluation of the
    validation tokens the schedule scores, in slot seconds and in device-seconds (a CPU trial's CPU seconds per
    wall-clock second; a GPU trial's GPUs)."""
    per_turn = validation_tokens_per_turn(spec.training, valid_tokens)
    gpus = spec.resources.gpus_per_trial
    speeds = []
    for family, timing in timings.items():
        devices = gpus if gpus > 0 else timing.cpu_per_wall
        evaluation = timing.evaluation_seconds_per_token * per_turn
        speeds.append(FamilySpeed(family, timing.step_seconds, timing.step_seconds * devices, evaluation,
                                  evaluation * devices))
    return speeds


def plan_budget(spec: StudySpec, speeds: Sequence[FamilySpeed], parallel_trials: int, *,
                measured: str = "") -> BudgetPlan:
    """The rungs of every family for the study's compute budget, at the measured `speeds` (one per family). Raises
    BudgetTooSmall where the budget does not pay for one turn at the lowest rung."""
    budget = spec.compute_budget
    if budget is None:
        raise ValueError(f"study {spec.name!r} has no compute_budget")
    unit, amount, seconds = budget_in_seconds(budget, spec, parallel_trials)
    wall = budget.wall_minutes is not None  # the budget counts slot-seconds, not device-seconds
    schedule = spec.training
    turn = schedule.steps_per_turn
    reruns = spec.reruns.top * spec.reruns.seeds if spec.reruns is not None else 0
    fractions = [budget.reduction_factor ** -(budget.rungs - 1 - k) for k in range(budget.rungs)]
    # steps trained by all of a family's configurations and reruns, per step of the top rung
    steps_per_top_step = sum(budget.configurations_at(k) * (fractions[k] - (fractions[k - 1] if k else 0.0))
                             for k in range(budget.rungs)) + reruns
    by_family = {speed.family: speed for speed in speeds}
    missing = [family for family in spec.families if family not in by_family]
    if missing:
        raise ValueError(f"no measured speed for {', '.join(missing)}")

    def cost_per_step(speed: FamilySpeed) -> float:
        step, evaluation = (speed.step_wall, speed.evaluation_wall) if wall else \
            (speed.step_device, speed.evaluation_device)
        return step + evaluation / turn

    if budget.equal == "tokens":
        top = seconds / (steps_per_top_step * sum(cost_per_step(by_family[f]) for f in spec.families))
        tops = dict.fromkeys(spec.families, top)
    else:
        share = seconds / len(spec.families)
        tops = {f: share / (steps_per_top_step * cost_per_step(by_family[f])) for f in spec.families}
    tokens_per_step = schedule.batch_size * schedule.bptt
    families = []
    for family in spec.families:
        steps = rung_steps(tops[family], fractions, turn)
        if steps is None:
            smallest = min(tops.values())
            raise BudgetTooSmall(
                f"compute_budget: {amount:g} {unit} buys {family} about {smallest:.0f} steps at the top rung, too few "
                f"for {budget.rungs} rung(s) of at least one turn ({turn} steps) each at reduction factor "
                f"{budget.reduction_factor}; give at least {minimum_budget(amount, smallest, fractions, turn):.3g} "
                f"{unit}, fewer rungs, or fewer training.steps_per_turn")
        speed = by_family[family]
        rungs = [Rung(configurations=budget.configurations_at(k), steps=s, tokens=s * tokens_per_step)
                 for k, s in enumerate(steps)]
        trained = family_steps(rungs) + reruns * steps[-1]
        families.append(FamilyBudget(
            family=family, rungs=rungs, tokens=trained * tokens_per_step,
            device_seconds=trained * (speed.step_device + speed.evaluation_device / turn),
            tokens_per_second=tokens_per_step / speed.step_device if speed.step_device > 0 else math.inf))
    device_unit = "GPU-hours" if spec.resources.gpus_per_trial > 0 else "core-hours"
    return BudgetPlan(unit=unit, amount=amount, budget_seconds=seconds, device_unit=device_unit, equal=budget.equal,
                      reduction_factor=budget.reduction_factor, steps_per_turn=turn, tokens_per_step=tokens_per_step,
                      parallel_trials=parallel_trials, families=families,
                      expected_seconds=expected_wall_seconds(families, by_family, parallel_trials, turn, reruns),
                      reruns=reruns, measured=measured)


def budget_in_seconds(budget: ComputeBudget, spec: StudySpec, parallel_trials: int) -> tuple[str, float, float]:
    """The budget's unit, amount and seconds: device-seconds for core- and GPU-hours, slot-seconds for wall
    minutes (each of `parallel_trials` slots busy for that long)."""
    if budget.core_hours is not None:
        return "core-hours", budget.core_hours, budget.core_hours * 3600.0
    if budget.gpu_hours is not None:
        return "GPU-hours", budget.gpu_hours, budget.gpu_hours * 3600.0
    return "wall minutes", budget.wall_minutes, budget.wall_minutes * 60.0 * parallel_trials


def rung_steps(top: float, fractions: Sequence[float], turn: int) -> list[int] | None:
    """Each rung's end in steps: its fraction of `top`, rounded to whole turns, every rung at least one turn past the
    one below; None where `top` is too short for that (the lowest rung would round to no turn at all)."""
    if top < shortest_top(fractions, turn):
        return None
    steps: list[int] = []
    for fraction in fractions:
        steps.append(max(round(fraction * top / turn), len(steps) + 1) * turn)
    return steps


def shortest_top(fractions: Sequence[float], turn: int) -> float:
    """The fewest top-rung steps that give every rung a turn of its own and the lowest at least half a turn."""
    return max(turn * len(fractions), turn / (2 * fractions[0]))


def minimum_budget(amount: float, top: float, fractions: Sequence[float], turn: int) -> float:
    """The budget (in the unit of `amount`) whose top rung would be long enough for every rung to be a turn."""
    return amount * shortest_top(fractions, turn) / max(top, 1e-9)


def family_steps(rungs: Sequence[Rung]) -> int:
    """Steps the family's configurations train in all: each rung's configurations from the rung below's end."""
    return sum(rung.configurations * (rung.steps - (rungs[k - 1].steps if k else 0)) for k, rung in enumerate(rungs))


def expected_wall_seconds(families: Sequence[FamilyBudget], speeds: dict[str, FamilySpeed], slots: int,
                          turn: int, reruns: int) -> float:
    """When the last segment ends, with `slots` trial slots: each family's rung k segments start once its rung
    k - 1 is done (the promotions wait for every configuration of the rung); a free slot takes the family that is
    furthest behind in its plan; reruns follow once tuning is done, as in the controller."""
    def seconds(family: FamilyBudget, steps: int) -> float:
        speed = speeds[family.family]
        return steps * speed.step_wall + steps / turn * speed.evaluation_wall

    totals = {f.family: family_steps(f.rungs) for f in families}
    issued = dict.fromkeys(totals, 0)
    rung = dict.fromkeys(totals, 0)
    waiting = {f.family: f.rungs[0].configurations for f in families}  # segments of the current rung not started
    unfinished = dict(waiting)  # segments of the current rung not ended
    running: list[tuple[float, str]] = []
    now = 0.0
    by_name = {f.family: f for f in families}
    while True:
        startable = [name for name in totals if waiting[name] > 0]
        if startable and len(running) < slots:
            family = by_name[min(startable, key=lambda name: issued[name] / max(totals[name], 1))]
            rungs, k = family.rungs, rung[family.family]
            length = rungs[k].steps - (rungs[k - 1].steps if k else 0)
            heapq.heappush(running, (now + seconds(family, length), family.family))
            waiting[family.family] -= 1
            issued[family.family] += length
            continue
        if not running:
            break
        now, name = heapq.heappop(running)
        unfinished[name] -= 1
        if unfinished[name] == 0 and rung[name] + 1 < len(by_name[name].rungs):
            rung[name] += 1
            waiting[name] = unfinished[name] = by_name[name].rungs[rung[name]].configurations
    rerun_seconds = sum(reruns * seconds(f, f.top_steps) for f in families)
    return now + rerun_seconds / slots
