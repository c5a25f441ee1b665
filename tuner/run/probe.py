"""The probe behind `tuner plan`'s time estimates: each family's median-shaped model trained for a few real steps
and evaluated on this machine, with the study's schedule, threads and device, for about ten seconds in all (longer
where a single step outlasts that: a model built for a GPU, probed on a laptop).

Speed does not depend on which tokens a model reads, so the probe trains on random tokens of the study's
vocabulary size; only the corpus's sizes matter, read from the configuration where it fixes them.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lm_tuner.models.cuda_graphs import captured_graphs
from lm_tuner.trainers import Corpus, ReverseCopyConfig, Schedule, Vocabulary
from lm_tuner.trainers.evaluation import streams_cross_entropy
from lm_tuner.trainers.temperature import search_windows, searched_streams_cross_entropy
from lm_tuner.trainers.training_run import TrainingRun
from lm_tuner.trainers.validation_cut import validation_cut
from lm_tuner.tuner.run.machine import this_machine
from lm_tuner.tuner.run.study_data import corpus_size, data_notes, data_warnings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.cost import PROBED, Speed, probe_can_run, with_cost, with_counted_cost
from lm_tuner.tuner.spec.estimate import (
    CorpusSize,
    Machine,
    ProbeTiming,
    validation_tokens_per_turn,
    with_estimates,
)
from lm_tuner.tuner.spec.plan import FamilyPlan, StudyPlan, plan_study
from lm_tuner.tuner.spec.space import trial_setup

PROBE_SECONDS = 10.0
TRAINING_SHARE = 0.6  # of each family's probe time; the rest times evaluation
MAX_TIMED_RUNS = 50  # training steps or evaluations
EVALUATION_WINDOWS = 4  # per validation stream, at most: the probe scores the turns' streams, this far along
PASS_TRIES = 5  # timings of a validation pass on one window and on all, each, at most
PASS_SHARE = 0.1  # of each family's probe time, for those timings without and again with the temperature search
WARM_UP_LIMIT = 60.0  # seconds a GPU probe waits, at most, for a model's first steps to stop capturing CUDA graphs
_PROBING = threading.Lock()


def study_plan(spec: StudySpec, *, probe: bool, seconds: float = PROBE_SECONDS,
               probing: Callable[[], None] | None = None,
               probed: Callable[[str, ProbeTiming, float], None] | None = None,
               machine: Machine | None = None) -> StudyPlan:
    """What `tuner plan` and `POST /studies/plan` answer: the shapes, warnings and cost, with the probe's time
    estimates when `probe` and the probe can run here (`probing` is called as the probe starts, once the data is read;
    `probed` is told each family's timing and the seconds its probe took, as it is done); else the cost from a FLOP
    count. `machine` is the one the cost is for, this one unless given. Raises DatasetUnavailable where the corpus's
    sizes need the data."""
    size = corpus_size(spec)
    planned = plan_study(spec, size.vocab_size)
    planned = planned.model_copy(update={"warnings": [*planned.warnings, *data_warnings(spec)],
                                         "notes": [*planned.notes, *data_notes(spec)]})
    machine = machine or this_machine()
    cannot_probe = probe_can_run(spec, machine) if probe else None
    if not probe or cannot_probe is not None:
        return with_counted_cost(spec, planned, size, machine,
                                 notes=[] if cannot_probe is None else [f"not probed: {cannot_probe}"])
    if probing is not None:
        probing()
    return probe_study(spec, planned, size, seconds, probed, machine)


def probe_study(spec: StudySpec, plan: StudyPlan, size: CorpusSize, seconds: float = PROBE_SECONDS,
                probed: Callable[[str, ProbeTiming, float], None] | None = None,
                machine: Machine | None = None) -> StudyPlan:
    """The plan with time estimates and the cost from probing every family that has a median shape, `seconds` split
    among them; the study's threads per trial and, where it asks for one and there is one, a GPU."""
    machine = machine or this_machine()
    device = torch.device("cuda" if spec.resources.gpus_per_trial > 0 and machine.gpus > 0 else "cpu")
    threads = max(1, int(spec.resources.cpus_per_trial))  # as trials set them (tuner/run/trial.py)
    shaped = [family for family in plan.families if family.median_point is not None]
    started = time.perf_counter()
    timings = {}
    with _torch_settings(threads, spec.resources.float32_matmul_precision):
        for family in shaped:
            family_started = time.perf_counter()
            timings[family.family] = probe_family(spec, family, size, seconds / max(1, len(shaped)), device)
            if probed is not None:
                probed(family.family, timings[family.family], time.perf_counter() - family_started)
    estimated = with_estimates(plan, spec, timings, size, machine=machine, device=str(device), threads=threads,
                               probe_seconds=time.perf_counter() - started)
    where = machine.gpu_name if device.type == "cuda" else f"this machine's CPU, {threads} thread(s) per trial"
    speed = Speed(timings, PROBED, f"each family's median shape timed on {where} for "
                                   f"{estimated.estimate.probe_seconds:.1f} s", "timed here by the probe")
    return with_cost(spec, estimated, size, machine, speed)


def probe_family(spec: StudySpec, family: FamilyPlan, size: CorpusSize, seconds: float,
                 device: torch.device) -> ProbeTiming:
    """Time training steps for TRAINING_SHARE of `seconds`, then turns' evaluations for the rest, each after untimed
    runs that warm up (`_timed`; on a GPU until no step captures a CUDA graph); on a CPU a shape so slow that one
    step outlasts the time is measured on that one step and one evaluation."""
    setup = trial_setup(spec, family.family, family.median_point, size.vocab_size, seed=spec.tuning.seed)
    layout = ValidationLayout.of(spec.training, size.valid_tokens)
    # A turn is one step; the validation split is the turns' streams, EVALUATION_WINDOWS windows long at most.
    schedule = setup.training.schedule.model_copy(update={"steps_per_turn": 1, "validation_tokens": None,
                                                          "eval_batch_size": layout.streams})
    run = TrainingRun(setup.model, setup.training.model_copy(update={"schedule": schedule}),
                      _random_corpus(size.vocab_size, schedule.batch_size, layout.streams,
                                     schedule.bptt * layout.probed_windows + 1, schedule.bptt),
                      device)
    on_gpu = device.type == "cuda"
    cpu, wall = time.process_time(), time.perf_counter()
    # a step ends on its loss's .item()
    steps = _timed(run.train_turn, seconds * TRAINING_SHARE, warming=_capturing(run.model) if on_gpu else None)
    cpu_per_wall = (time.process_time() - cpu) / (time.perf_counter() - wall)
    # a turn's evaluation (every weight average it scores), each after a step as in a trial
    passes_before, evaluated = run.validation_passes, []
    evaluations = _timed(lambda: evaluated.append(run.evaluate()), seconds * (1 - TRAINING_SHARE),
                         before=run.train_turn, warming=(lambda: False) if on_gpu else None)
    turn_seconds = layout.turn_seconds(statistics.median(evaluations),
                                       (run.validation_passes - passes_before) / len(evaluated),
                                       _pass_cost(run, searched=False, seconds=seconds * PASS_SHARE),
                                       _pass_cost(run, searched=True, seconds=seconds * PASS_SHARE)
                                       if layout.searched else None,
                                       extra_passes=int(isinstance(spec.dataset, ReverseCopyConfig)))
    return ProbeTiming(step_seconds=statistics.median(steps),
                       evaluation_seconds_per_token=turn_seconds / validation_tokens_per_turn(spec.training,
                                                                                              size.valid_tokens),
                       cpu_per_wall=cpu_per_wall)


@dataclass(frozen=True)
class ValidationLayout:
    """The validation streams a trial's turns score, as windows: `windows` per stream, of which the softmax
    temperature search reads the first `searched`; the probe scores `probed_windows` per stream."""

    streams: int
    windows: int
    searched: int

    @classmethod
    def of(cls, schedule: Schedule, valid_tokens: int) -> ValidationLayout:
        cut = validation_cut(schedule, valid_tokens)  # as TrainingRun cuts them
        windows = max(1, math.ceil((cut.tokens // cut.streams - 1) / schedule.bptt))
        searched = min(windows, search_windows(cut.streams, schedule.bptt)) if schedule.search_temperature else 0
        return cls(cut.streams, windows, searched)

    @property
    def probed_windows(self) -> int:
        return min(self.windows, EVALUATION_WINDOWS)

    def turn_seconds(self, evaluation: float, passes: float, plain: PassCost, searched: PassCost | None, *,
                     extra_passes: int) -> float:
        """A turn's evaluation on the real streams, from the probe's (`evaluation`: `passes` passes, one per weight
        average scored, each with the temperature search where the schedule asks for it) and the costs of one pass
        without and with the search: each pass's windows at their cost, the search's grid only on the windows it
        reads. What the probe's evaluation took beyond its passes (swapping weights, the averaging's bookkeeping)
        is added once, not scaled with the windows. `extra_passes`: deterministic passes a turn adds (the reversed
        halves of reverse copy)."""
        probed_pass = plain.seconds(self.probed_windows) if searched is None else searched.seconds(self.probed_windows)
        real_pass = plain.seconds(self.windows) if searched is None else \
            searched.seconds(self.searched) + plain.per_window * (self.windows - self.searched)
        beyond_passes = max(0.0, evaluation - passes * probed_pass)
        return passes * real_pass + beyond_passes + extra_passes * plain.seconds(self.windows)


@dataclass(frozen=True)
class PassCost:
    """One evaluation pass over the validation streams: a fixed part (switching modes and weights, the state, the
    synchronisation at the end) and a part per window of every stream."""

    fixed: float
    per_window: float

    def seconds(self, windows: int) -> float:
        return self.fixed + self.per_window * windows


def _pass_cost(run: TrainingRun, *, searched: bool, seconds: float) -> PassCost:
    """A pass over the probe's validation streams, with or without the temperature search, timed on one window and
    on all, in turns (a slow spell of the machine then hits both alike), the least of each kept: a trial's
    evaluation extrapolates the difference to its windows, tens or hundreds of them. Up to PASS_TRIES times each,
    while another try fits in `seconds`; once where a single try does not (a 24M-parameter model on a CPU: 10 s)."""
    bptt, whole = run.schedule.bptt, run.validation
    score = searched_streams_cross_entropy if searched else streams_cross_entropy
    one, every = math.inf, math.inf
    until = time.perf_counter() + seconds
    for _ in range(PASS_TRIES):
        started = time.perf_counter()
        one = min(one, _duration(lambda: score(run.model, whole[:bptt + 1], bptt)))
        every = min(every, _duration(lambda: score(run.model, whole, bptt)))
        now = time.perf_counter()
        if now + (now - started) > until:  # another try, as long as this one, would end past `until`
            break
    windows = math.ceil((whole.shape[0] - 1) / bptt)
    per_window = max(0.0, (every - one) / (windows - 1)) if windows > 1 else every
    return PassCost(fixed=max(0.0, every - per_window * windows), per_window=per_window)


def _duration(action: Callable[[], object], before: Callable[[], object] | None = None) -> float:
    if before is not None:
        before()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _timed(action: Callable[[], object], seconds: float, before: Callable[[], object] | None = None,
           warming: Callable[[], bool] | None = None) -> list[float]:
    """Durations of `action` (each after an untimed `before`, if given) repeated for `seconds` (at least once, at most
    MAX_TIMED_RUNS times) after a first run that warms up (kernels are built, memory allocated) and is not timed.

    `warming`, on a GPU: whether the run before was warming up too (it captured a CUDA graph: seconds, where a
    replay takes milliseconds); runs go on untimed while it says so, WARM_UP_LIMIT seconds at most. Without it (a
    CPU), a first run that outlasts `seconds` is the measurement: a shape too slow to run twice."""
    first = _duration(action, before)
    if warming is None and first > seconds:
        return [first]
    if warming is not None:
        deadline = time.perf_counter() + WARM_UP_LIMIT
        while warming() and time.perf_counter() < deadline:
            _duration(action, before)
    durations: list[float] = []
    until = time.perf_counter() + seconds
    while not durations or (time.perf_counter() < until and len(durations) < MAX_TIMED_RUNS):
        durations.append(_duration(action, before))
    return durations


def _capturing(model: torch.nn.Module) -> Callable[[], bool]:
    """Whether `model`'s last training step captured a CUDA graph."""
    counts = [captured_graphs(model)]

    def captured() -> bool:
        counts.append(captured_graphs(model))
        return counts[-1] != counts[-2]

    return captured


def _random_corpus(vocab_size: int, batch_size: int, streams: int, stream_tokens: int, bptt: int) -> Corpus:
    """Uniform random tokens: enough training windows for every timed step (variable-length windows are drawn up
    to ~2x bptt, and the stream wraps around when it runs out), and `streams` validation streams of
    `stream_tokens` tokens."""
    generator = torch.Generator().manual_seed(0)

    def tokens(count: int) -> torch.Tensor:
        return torch.randint(vocab_size, (count,), generator=generator)

    width = len(str(vocab_size - 1))
    return Corpus(Vocabulary(tuple(f"t{i:0{width}d}" for i in range(vocab_size))),
                  train=tokens(batch_size * (bptt * (MAX_TIMED_RUNS + 1) + 1)),
                  valid=tokens(streams * stream_tokens), test=tokens(2),
                  description=f"random tokens of {vocab_size} types (the probe)")


@contextmanager
def _torch_settings(threads: int, matmul_precision: str) -> Iterator[None]:
    """A trial's torch threads and matmul precision while probing, the process's own restored after (the API
    serves on); the random generators too, which a training run seeds."""
    with _PROBING:  # the settings are the process's: one probe at a time
        before = torch.get_num_threads(), torch.get_float32_matmul_precision()
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(matmul_precision)
        try:
            with torch.random.fork_rng(devices=[]):
                yield
        finally:
            torch.set_num_threads(before[0])
            torch.set_float32_matmul_precision(before[1])
