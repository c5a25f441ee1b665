"""What a study costs before it runs: GPU-hours or core-hours, and the time it takes with its trials in parallel on
this machine, for tuning, reruns and the later stages (docs/usage.md, "What a study costs").

Every part is tokens times seconds per token, per family at its median shape. Seconds per token come from the probe
where it ran (this machine's speed for that shape: tuner/run/probe.py), and otherwise from a FLOP count of the shape
(lm_tuner.models.flops) divided by the FLOP/s benchmarks/cell_throughput.py achieved on a machine of this kind
(tuner/spec/throughput.py); the cost says which. Tokens are the schedule's: trials x steps x batch x bptt and the
evaluations after each turn (tuner/spec/estimate.py, as the probe's estimate counts them), the reruns, the test
protocol (each evaluated checkpoint on validation and test, once more per Monte-Carlo sample and multiplier) and
dynamic evaluation (each trial adapts on the RMS windows and validation; the chosen settings on validation and test).

A FLOP count at the benchmark's speed is a floor for models narrower than the benchmark's (512): small matrices
reach fewer FLOP/s, and a step's fixed work (the optimiser, averaging, Python) weighs more; the cost then says
"at least".
"""

from __future__ import annotations

from dataclasses import dataclass

from lm_tuner.models.flops import forward_flops_per_token, training_flops_per_token
from lm_tuner.trainers import Schedule
from lm_tuner.tuner.spec.budget_plan import BudgetTooSmall, family_speeds, family_steps, plan_budget
from lm_tuner.tuner.spec.document import StudySpec
from lm_tuner.tuner.spec.estimate import (
    CorpusSize,
    Machine,
    ProbeTiming,
    estimate_trial,
    parallel_trials,
    validation_tokens_per_turn,
)
from lm_tuner.tuner.spec.plan import BudgetPlan, StudyCost, StudyPlan
from lm_tuner.tuner.spec.space import trial_setup
from lm_tuner.tuner.spec.throughput import Device, measured_throughput

DAY_SECONDS = 86_400.0
PROBED = "probe"
COUNTED = "flop count"


@dataclass(frozen=True)
class Speed:
    """Each family's timing at its median shape, and where it comes from."""

    timings: dict[str, ProbeTiming]
    source: str  # PROBED or COUNTED
    measured: str  # in a sentence, for the record
    said: str  # in a few words, for the one line
    notes: tuple[str, ...] = ()
    floor: bool = False  # the timings are at least what the study takes, maybe far less


@dataclass(frozen=True)
class Tokens:
    """Tokens of a stage: scored by a forward pass only, or trained on (forward and backward)."""

    forward: float = 0.0
    training: float = 0.0

    def __mul__(self, times: float) -> Tokens:
        return Tokens(self.forward * times, self.training * times)


def study_device(spec: StudySpec) -> Device:
    return "gpu" if spec.resources.gpus_per_trial > 0 else "cpu"


def probe_can_run(spec: StudySpec, machine: Machine) -> str | None:
    """Why the probe cannot measure this study here (it asks for a GPU this machine lacks); None where it can."""
    if study_device(spec) == "gpu" and machine.gpus == 0:
        return f"the study asks for a GPU and {machine.called} has none"
    return None


def with_counted_cost(spec: StudySpec, plan: StudyPlan, size: CorpusSize, machine: Machine, *,
                      notes: list[str] | None = None) -> StudyPlan:
    """The plan with its cost from a FLOP count (`notes`: why the probe did not run, where it was asked to)."""
    speed = counted_speed(spec, plan, machine)
    speed = Speed(speed.timings, speed.source, speed.measured, speed.said, (*(notes or []), *speed.notes), speed.floor)
    return with_cost(spec, plan, size, machine, speed)


def with_cost(spec: StudySpec, plan: StudyPlan, size: CorpusSize, machine: Machine, speed: Speed) -> StudyPlan:
    """The plan with its cost at `speed`; for a study with a compute budget, with the budget's split too (or, where
    the budget buys too little, the warning a launch would refuse it with)."""
    budget, warnings = None, list(plan.warnings)
    if spec.compute_budget is not None and speed.timings:
        slots = parallel_trials(spec, machine) if _lacking(spec, machine) is None else spec.tuning.concurrency
        try:
            budget = plan_budget(spec, family_speeds(spec, speed.timings, size.valid_tokens), slots,
                                 measured=speed.said)
        except BudgetTooSmall as error:
            warnings.append(f"{error} (a launch refuses it)")
    if budget is not None:
        plan = budgeted_estimates(plan, budget)
    return plan.model_copy(update={"cost": study_cost(spec, plan, size, machine, speed, budget), "budget": budget,
                                   "warnings": warnings})


def budgeted_estimates(plan: StudyPlan, budget: BudgetPlan) -> StudyPlan:
    """The probe's estimates where a compute budget decides how far trials train: a trial is a finalist's run to the
    top rung, and the study ends when the budget's split says."""
    families = []
    for family in plan.families:
        estimate = family.estimate
        if estimate is not None:
            steps = budget.family(family.family).top_steps
            turns = steps // budget.steps_per_turn
            trial = steps * estimate.step_seconds + turns * estimate.evaluation_seconds
            estimate = estimate.model_copy(update={"turns": turns, "trial_seconds": trial,
                                                   "evaluation_share": turns * estimate.evaluation_seconds / trial})
        families.append(family.model_copy(update={"estimate": estimate}))
    study = plan.estimate and plan.estimate.model_copy(update={"study_seconds": budget.expected_seconds})
    return plan.model_copy(update={"families": families, "estimate": study})


def counted_speed(spec: StudySpec, plan: StudyPlan, machine: Machine) -> Speed:
    """What the probe would measure, from each family's FLOP count at its median shape and the FLOP/s measured on a
    machine of this kind."""
    shaped = [family for family in plan.families if family.median_point is not None]
    device = study_device(spec)
    threads = max(1, int(spec.resources.cpus_per_trial))
    throughput = measured_throughput([family.family for family in shaped], device=device, threads=threads,
                                     cpu_kind=machine.cpu_kind, gpu_name=machine.gpu_name,
                                     character_level=spec.character_level)
    schedule, timings = spec.training, {}
    for family in shaped:
        model = trial_setup(spec, family.family, family.median_point, plan.vocab_size, seed=0).model
        rate = throughput.flops_per_second[family.family]
        timings[family.family] = ProbeTiming(
            step_seconds=schedule.batch_size * schedule.bptt * training_flops_per_token(model) / rate,
            evaluation_seconds_per_token=forward_flops_per_token(model) / rate,
            cpu_per_wall=threads if device == "cpu" else 1.0)
    narrow = [family.family for family in shaped if family.hidden_size.median < throughput.hidden_size]
    notes = list(throughput.notes)
    if narrow:
        notes.append(f"{', '.join(narrow)}: median hidden size below the {throughput.hidden_size} measured; smaller "
                     f"models reach fewer FLOP/s, so this is a floor (`tuner plan` with its probe times them here)")
    return Speed(timings, COUNTED, throughput.measured, f"a FLOP count at the speed measured on {throughput.machine}",
                 tuple(notes), floor=bool(narrow))


def study_cost(spec: StudySpec, plan: StudyPlan, size: CorpusSize, machine: Machine, speed: Speed,
               budget: BudgetPlan | None = None) -> StudyCost:
    """The study's device-hours and duration, each family's stages at its `speed`; the tuning and reruns of a study
    with a compute budget as its split (`budget`) says, and its duration the split's expected end plus the later
    stages."""
    device = study_device(spec)
    per_trial = spec.resources.gpus_per_trial if device == "gpu" else spec.resources.cpus_per_trial
    lacking = _lacking(spec, machine)
    slots = parallel_trials(spec, machine) if lacking is None else spec.tuning.concurrency
    seconds: dict[str, float] = {}
    flops = training_tokens = 0.0
    schedule = spec.training
    for family in plan.families:
        if family.family not in speed.timings:
            continue
        timing = speed.timings[family.family]
        model = trial_setup(spec, family.family, family.median_point, plan.vocab_size, seed=0).model
        trial = estimate_trial(schedule, timing, size)
        trial_tokens = Tokens(forward=trial.turns * validation_tokens_per_turn(schedule, size.valid_tokens),
                              training=trial.turns * schedule.steps_per_turn * schedule.batch_size * schedule.bptt)
        runs = {"tuning": spec.tuning.trials}
        if spec.reruns is not None:
            runs["reruns"] = spec.reruns.top * spec.reruns.seeds
        stages = {stage: (count * trial.trial_seconds, trial_tokens * count) for stage, count in runs.items()} \
            if budget is None else budgeted_stages(budget, family.family, timing, schedule, size.valid_tokens)
        training_tokens += sum(tokens.training for _, tokens in stages.values())
        token_seconds = timing.step_seconds / (schedule.batch_size * schedule.bptt)
        for stage, tokens in later_stages(spec, size).items():
            stages[stage] = (tokens.forward * timing.evaluation_seconds_per_token + tokens.training * token_seconds,
                             tokens)
        for stage, (stage_seconds, tokens) in stages.items():
            seconds[stage] = seconds.get(stage, 0.0) + stage_seconds
            flops += tokens.forward * forward_flops_per_token(model) + tokens.training * training_flops_per_token(model)
    wall = sum(seconds.values()) / slots if budget is None else \
        budget.expected_seconds + sum(value for stage, value in seconds.items() if stage not in BUDGETED) / slots
    cost = StudyCost(
        source=speed.source, measured=speed.measured, notes=list(speed.notes), lower_bound=speed.floor,
        device=device, unit="GPU-hours" if device == "gpu" else "core-hours",
        device_hours=sum(seconds.values()) * per_trial / 3600,
        stages={stage: stage_seconds * per_trial / 3600 for stage, stage_seconds in seconds.items()},
        flops=flops, training_tokens=round(training_tokens), parallel_trials=slots, wall_seconds=wall,
        on_this_machine=lacking is None, over_a_day=wall > DAY_SECONDS, summary="", not_included=_not_included(spec))
    return cost.model_copy(update={"summary": cost_line(cost, speed.said, lacking, machine.called)})


BUDGETED = ("tuning", "reruns")
"""The stages a compute budget pays for."""


def budgeted_stages(budget: BudgetPlan, family: str, timing: ProbeTiming, schedule: Schedule,
                    valid_tokens: int) -> dict[str, tuple[float, Tokens]]:
    """Slot-seconds and tokens of a family's rungs and reruns, as its compute budget splits them."""
    planned = budget.family(family)
    per_turn = validation_tokens_per_turn(schedule, valid_tokens)
    turn_seconds = schedule.steps_per_turn * timing.step_seconds + timing.evaluation_seconds_per_token * per_turn

    def stage(steps: int) -> tuple[float, Tokens]:
        turns = steps / schedule.steps_per_turn
        return turns * turn_seconds, Tokens(forward=turns * per_turn, training=steps * budget.tokens_per_step)

    reruns = budget.reruns * planned.top_steps
    stages = {"tuning": stage(family_steps(planned.rungs))}
    if reruns:
        stages["reruns"] = stage(reruns)
    return stages


def _lacking(spec: StudySpec, machine: Machine) -> str | None:
    """What this machine lacks to run a trial at all (the GPU, or the cores, one asks for); None if nothing."""
    resources = spec.resources
    if resources.gpus_per_trial > machine.gpus:
        return f"{machine.called} has no GPU" if machine.gpus == 0 else \
            f"a trial asks for {resources.gpus_per_trial:g} GPUs, {machine.called} has {machine.gpus}"
    if resources.cpus_per_trial > machine.cpus:
        return f"a trial asks for {resources.cpus_per_trial:g} cores, {machine.called} has {machine.cpus}"
    return None


def later_stages(spec: StudySpec, size: CorpusSize) -> dict[str, Tokens]:
    """Tokens of one family's stages after tuning: full validations, the test protocol, dynamic evaluation."""
    finals = spec.reruns.top * spec.reruns.seeds if spec.reruns is not None else 1
    evaluated = finals + (1 if spec.reruns is not None else 0)  # and the best tuning trial, beside the reruns
    stages: dict[str, Tokens] = {}
    if spec.training.validation_tokens is not None and spec.training.validation_tokens < size.valid_tokens:
        stages["full validation"] = Tokens(forward=evaluated * size.valid_tokens)
    both = size.valid_tokens + size.test_tokens
    evaluation = spec.evaluation
    if evaluation is not None:
        passes = 1 + evaluation.mc_samples * len(evaluation.mc_multipliers)
        stages["test protocol"] = Tokens(forward=evaluated * both * passes)
    stage = spec.dynamic_evaluation
    if stage is not None and evaluation is not None:
        rms = size.train_tokens if stage.rms_windows is None else \
            min(size.train_tokens, stage.rms_windows * stage.rms_batch_size * spec.training.bptt)
        final = rms + both * (1 + evaluation.mc_samples)
        per_checkpoint = stage.trials * (rms + size.valid_tokens) + final
        stages["dynamic evaluation"] = Tokens(training=min(stage.top, finals) * per_checkpoint)
    return stages


def _not_included(spec: StudySpec) -> list[str]:
    left_out = ["starting Ray and each trial's process"]
    if spec.early_stopping.method != "none":
        left_out.append(f"early stopping ({spec.early_stopping.method}), which ends some trials sooner")
    if spec.evaluation is not None and spec.evaluation.temperature:
        left_out.append("the test protocol's temperature search")
    return left_out


def cost_line(cost: StudyCost, said: str, lacking: str | None, machine: str) -> str:
    """The cost in one line: device-hours, the duration with the trials in parallel (on `machine`, or where it
    cannot run a trial, on machines of the kind measured), more than a day or not, and the source."""
    how_much = "at least" if cost.lower_bound else "about"
    trials = f"{cost.parallel_trials} trial{'s' if cost.parallel_trials > 1 else ''} at a time"
    where = f"on {machine}, {trials}" if lacking is None else \
        f"with {trials} on machines of the kind measured ({lacking})"
    long = f", more than {DAY_SECONDS / 3600:.0f} hours" if cost.over_a_day else ""
    return (f"{how_much} {_amount(cost.device_hours)} {cost.unit}: {duration(cost.wall_seconds)} {where}{long} "
            f"({said})")


def _amount(hours: float) -> str:
    if hours >= 10:
        return f"{hours:,.0f}"
    return f"{hours:.2g}" if hours >= 0.01 else f"{hours:.1g}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 42 s, 12 min, 3.5 h, 12 days, 2.5 years."""
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_SECONDS:
        return f"{seconds / 3600:.1f} h"
    if seconds < 365 * DAY_SECONDS:
        return f"{seconds / DAY_SECONDS:,.1f} days" if seconds < 10 * DAY_SECONDS else \
            f"{seconds / DAY_SECONDS:,.0f} days"
    return f"{seconds / DAY_SECONDS / 365:,.1f} years"
