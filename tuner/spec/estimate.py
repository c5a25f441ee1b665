"""How long a study takes on a machine: a probe's measurements (tuner/run/probe.py) extrapolated with the
schedule's budget, evaluation included, and divided among the trials that run at once."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from lm_tuner.trainers import DatasetConfig, MarkovCorpusConfig, ReverseCopyConfig, Schedule
from lm_tuner.trainers.datasets import known_split_sizes, known_vocabulary_size
from lm_tuner.trainers.validation_cut import validation_cut
from lm_tuner.tuner.spec.document import StudySpec
from lm_tuner.tuner.spec.feasibility import reverse_copy_example_tokens
from lm_tuner.tuner.spec.plan import StudyEstimate, StudyPlan, TrialEstimate

MAX_EVALUATION_SHARE = 0.25
MIN_WARNED_EVALUATION_SECONDS = 5.0
"""Evaluation taking less of a trial than this is not warned about whatever its share: it costs less than starting
the trial (its process, data and model: about 6 s in benchmarks/results/study_efficiency_*.json), so shortening it
saves next to nothing, and the share of a trial of a fraction of a second is mostly noise."""


class CorpusSize(BaseModel):
    """What the plan needs of a corpus: its vocabulary, and the tokens of its splits."""

    vocab_size: int
    train_tokens: int
    valid_tokens: int
    test_tokens: int


class ProbeTiming(BaseModel):
    """One family's median-shaped model measured on this machine."""

    step_seconds: float = Field(description="one optimisation step (batch_size x bptt tokens)")
    evaluation_seconds_per_token: float = Field(description="scoring one validation token")
    cpu_per_wall: float = Field(description="process CPU seconds per wall-clock second while training")


class Machine(BaseModel):
    cpus: int
    gpus: int
    cpu_kind: str | None = Field(None, description="the CPU's family/model/stepping, as benchmarks record it")
    gpu_name: str | None = Field(None, description="the first GPU's name")
    called: str = Field("this machine", description="how estimates name it: this machine where a command runs, the "
                                                    "server's machine in answers over REST")


def known_corpus_size(dataset: DatasetConfig) -> CorpusSize | None:
    """The sizes a generated corpus fixes in its configuration, or a registered dataset pinned by checksum (PTB);
    None where only the files can tell."""
    if isinstance(dataset, MarkovCorpusConfig):
        return CorpusSize(vocab_size=dataset.vocab_size, train_tokens=dataset.train_tokens,
                          valid_tokens=dataset.valid_tokens, test_tokens=dataset.test_tokens)
    if isinstance(dataset, ReverseCopyConfig):
        example = reverse_copy_example_tokens(dataset)
        return CorpusSize(vocab_size=dataset.symbols + 2, train_tokens=dataset.train_examples * example,
                          valid_tokens=dataset.valid_examples * example, test_tokens=dataset.test_examples * example)
    splits = known_split_sizes(dataset)
    if splits is not None:
        return CorpusSize(vocab_size=known_vocabulary_size(dataset), train_tokens=splits[0], valid_tokens=splits[1],
                          test_tokens=splits[2])
    return None


def validation_tokens_per_turn(schedule: Schedule, valid_tokens: int) -> int:
    """Tokens each turn's evaluation scores: the schedule's subset or the whole split, less each stream's first."""
    return validation_cut(schedule, valid_tokens).scored


def estimate_trial(schedule: Schedule, timing: ProbeTiming, size: CorpusSize) -> TrialEstimate:
    """One trial's turns and seconds: steps at the probe's speed, plus an evaluation after every turn, and the
    fine-tuning turns where it is on (all of its budget: the trigger may end it sooner)."""
    evaluation = timing.evaluation_seconds_per_token * validation_tokens_per_turn(schedule, size.valid_tokens)
    turn_training = schedule.steps_per_turn * timing.step_seconds
    if schedule.budget_seconds is not None:  # the budget counts evaluations too
        wall_budget = schedule.budget_seconds / (timing.cpu_per_wall if schedule.clock == "process" else 1.0)
        turns = max(1, math.ceil(wall_budget / (turn_training + evaluation)))
        trial = wall_budget
    else:
        steps = training_steps(schedule, size.train_tokens)
        turns = math.ceil(steps / schedule.steps_per_turn)
        trial = steps * timing.step_seconds + turns * evaluation
    if schedule.fine_tuning.enabled:  # at most this many: the non-monotone trigger may stop it sooner
        fine_tuning_turns = schedule.fine_tuning.turns or turns
        turns += fine_tuning_turns
        trial += fine_tuning_turns * (turn_training + evaluation)
    return TrialEstimate(step_seconds=timing.step_seconds, evaluation_seconds=evaluation, turns=turns,
                         trial_seconds=trial, evaluation_share=turns * evaluation / trial if trial else 0.0)


def training_steps(schedule: Schedule, train_tokens: int) -> int:
    """Optimisation steps of a trial whose budget is not in seconds (before any fine-tuning)."""
    if schedule.budget_steps is not None:
        return schedule.budget_steps
    if schedule.budget_epochs is not None:
        windows_per_epoch = math.ceil((train_tokens // schedule.batch_size - 1) / schedule.bptt)
        return math.ceil(schedule.budget_epochs * windows_per_epoch)
    return schedule.turns * schedule.steps_per_turn


def parallel_trials(spec: StudySpec, machine: Machine) -> int:
    """Trials that run at once on `machine`: the concurrency, as far as its cores (and GPUs) allow."""
    resources = spec.resources
    fitting = math.floor(machine.cpus / resources.cpus_per_trial)
    if resources.gpus_per_trial > 0 and machine.gpus > 0:
        fitting = min(fitting, math.floor(machine.gpus / resources.gpus_per_trial))
    return max(1, min(spec.tuning.concurrency, fitting))


def machine_warnings(spec: StudySpec, machine: Machine) -> list[str]:
    """Resources this machine cannot give a trial: Ray would never start one here."""
    resources, warnings = spec.resources, []
    if resources.cpus_per_trial > machine.cpus:
        warnings.append(f"resources.cpus_per_trial: {resources.cpus_per_trial:g} but this machine has {machine.cpus} "
                        f"cores: no trial can start here (run on a cluster with --address, or lower it); the "
                        f"estimate assumes they do")
    if resources.gpus_per_trial > machine.gpus:
        warnings.append(f"resources.gpus_per_trial: {resources.gpus_per_trial:g} but this machine has "
                        f"{machine.gpus} GPUs: no trial can start here (run on a cluster with --address, or set it "
                        f"to 0); the probe ran on {'the CPU' if machine.gpus == 0 else 'one GPU'}")
    return warnings


def with_estimates(plan: StudyPlan, spec: StudySpec, timings: dict[str, ProbeTiming], size: CorpusSize, *,
                   machine: Machine, device: str, threads: int, probe_seconds: float) -> StudyPlan:
    """The plan with each family's trial estimate, the study's, and the evaluation-share and machine warnings."""
    families, warnings, work = [], [], 0.0
    for family in plan.families:
        if family.family not in timings:
            families.append(family)
            continue
        estimate = estimate_trial(spec.training, timings[family.family], size)
        families.append(family.model_copy(update={"estimate": estimate}))
        work += family.runs * estimate.trial_seconds
        if estimate.evaluation_share > MAX_EVALUATION_SHARE and \
                estimate.turns * estimate.evaluation_seconds >= MIN_WARNED_EVALUATION_SECONDS:
            warnings.append(
                f"family {family.family!r}: evaluation takes an estimated {estimate.evaluation_share:.0%} of each "
                f"trial ({estimate.evaluation_seconds:.1f} s per turn for "
                f"{validation_tokens_per_turn(spec.training, size.valid_tokens):,} validation tokens, "
                f"{spec.training.steps_per_turn * estimate.step_seconds:.1f} s of training): set "
                f"training.validation_tokens or raise training.steps_per_turn")
    slots = parallel_trials(spec, machine)
    study = StudyEstimate(study_seconds=work / slots, parallel_trials=slots, device=device, threads=threads,
                          probe_seconds=probe_seconds, not_included=_not_included(spec))
    return plan.model_copy(update={"families": families, "estimate": study,
                                   "warnings": plan.warnings + machine_warnings(spec, machine) + warnings})


def _not_included(spec: StudySpec) -> list[str]:
    stages = ["starting Ray and the trial processes"]
    if spec.evaluation is not None:
        stages.append("the test protocol (evaluation)")
    if spec.dynamic_evaluation is not None:
        stages.append("dynamic evaluation (stage 2)")
    return stages
