"""Short CPU training on real PTB: our LSTM and Mogrifier (4M parameters, 2TA) against a plain nn.LSTM.

Each model trains for the same wall-clock budget on `--threads` cores and reports a validation
curve: (wall seconds, CPU seconds, validation perplexity) at every evaluation, so the curves can be
compared at equal wall time.

- `lstm`, `mogrifier`: the project's own trainer (trainers.train) with a `budget_seconds` schedule,
  Two-Tailed Averaging, and the hidden size solved for `--parameter-budget` by the budget solver.
  Their hyperparameters are fixed (not tuned) and written to the JSON with the reasons for them.
- `reference`: a torch.nn.LSTM word language model built and trained the pytorch/examples
  word_language_model way (Embedding -> nn.LSTM -> Linear, dropout 0.2, untied, plain SGD at lr 20
  divided by 4 whenever validation does not improve, gradient clipping 0.25, batch 20, BPTT 35),
  with emsize = nhid sized to `--reference-parameters`.

Timing rules, the same for every model:
- the wall budget counts evaluations (the trainer's `budget_seconds` does, and so does the
  reference loop); a run ends after its last step past the budget and one final evaluation;
- during training every model is evaluated on the same fixed prefix of the validation text
  (`--eval-tokens`; a full pass over the 74k validation tokens costs 30-50 s on 2 cores and 2TA
  scores up to three weight sets per evaluation, so the full text would eat the budget), roughly
  every `--eval-every` seconds of training (for our models: that many seconds of steps, converted to
  a step count by timing three steps before the clock starts);
- after training, outside the budget, the best weights as of 3.5 minutes and as of the end (the
  weights a run would report: averaged ones for 2TA) are scored on the full validation text.

    PYTHONPATH=. python benchmarks/ptb_short.py --data /path/to/ptb --parallel --output ptb_short.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.cell_throughput import emit_json
from lm_tuner.models import ModelConfig, solve_hidden_size
from lm_tuner.trainers import (
    Corpus,
    Schedule,
    TrainingConfig,
    TurnReport,
    TwoTailedAveragingConfig,
    cross_entropy,
    dataset_from_dict,
    load_checkpoint,
    load_corpus,
    train,
)
from lm_tuner.trainers.batching import batchify, windows
from lm_tuner.trainers.training_run import TrainingRun

MODELS = ("lstm", "mogrifier", "reference")
EARLY_SECONDS = 210.0  # the 3.5-minute mark of the target
EVAL_BATCH_SIZE = 100  # parallel streams when evaluating (the same for every model)
EVAL_BPTT = 35

# Fixed hyperparameters of our models (not tuned); see OUR_SETTINGS_REASONS.
OUR_MODEL_FIELDS: dict[str, dict[str, Any]] = {
    "lstm": dict(family="lstm", num_layers=1, input_embedding_ratio=1.0, output_dropout=0.1),
    "mogrifier": dict(family="mogrifier", num_layers=1, input_embedding_ratio=1.0, output_dropout=0.1,
                      mogrifier_rounds=3, mogrifier_rank=0),
}
OUR_TRAINING = dict(learning_rate=0.004, l2_penalty=0.0, batch_size=32, bptt=35, max_grad_norm=10.0)
OUR_SETTINGS_REASONS = {
    "optimizer": "Adam with beta1 = 0, constant learning rate, gradient clipping to norm 10 "
                 "(docs/methodology.md#optimiser)",
    "learning_rate": "0.004, the top of the tuned range 0.001-0.004 (Table 2.4): a 10-minute run is far from "
                     "convergence, where the largest stable step learns fastest",
    "batch_size, bptt": "32 x 35 instead of the full-size 64 x 70: the run sees only a fraction of an epoch "
                        "to a few epochs, so more (smaller) updates per second beat larger windows",
    "dropout": "output_dropout 0.1, others 0: a 4M-parameter model does not overfit PTB within a few epochs, "
               "so dropout would only slow learning (the tuned full-size rates regularise 24M models over "
               "hundreds of epochs)",
    "num_layers": "1: at equal budget one layer runs more tokens per second than two on a CPU, and depth does "
                  "not pay within minutes",
    "mogrifier": "3 rounds, full rank: within the ablation's range (r = 0-6, full rank 54.6 vs best 54.1) and "
                 "the fastest of the tried settings on 2 CPU cores (low-rank factors double the small "
                 "per-step matrix products)",
    "averaging": "Two-Tailed Averaging (no hyperparameters; patience 3)",
}
REFERENCE_SETTINGS = dict(dropout=0.2, learning_rate=20.0, anneal=4.0, clip=0.25, batch_size=20, bptt=35,
                          num_layers=2, tied=False, init_range=0.1)


class ReferenceModel(nn.Module):
    """pytorch/examples word_language_model RNNModel (LSTM, untied): Embedding -> nn.LSTM -> Linear."""

    def __init__(self, vocab_size: int, size: int, num_layers: int, dropout: float, init_range: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, size)
        self.rnn = nn.LSTM(size, size, num_layers, dropout=dropout)
        self.decoder = nn.Linear(size, vocab_size)
        nn.init.uniform_(self.encoder.weight, -init_range, init_range)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -init_range, init_range)
        self.num_layers, self.size = num_layers, size

    def initial_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        zeros = torch.zeros(self.num_layers, batch_size, self.size)
        return zeros, zeros

    def forward(self, tokens: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, state = self.rnn(self.drop(self.encoder(tokens)), state)
        return self.decoder(self.drop(output)), state


def reference_parameters(vocab_size: int, size: int, num_layers: int) -> int:
    """Embedding + decoder (weight, bias) + nn.LSTM layers (two bias vectors each, as torch has)."""
    return 2 * vocab_size * size + vocab_size + num_layers * (8 * size * size + 8 * size)


def reference_size(vocab_size: int, parameters: int, num_layers: int) -> int:
    """The largest emsize = nhid whose reference model has at most `parameters` parameters."""
    size = 1
    while reference_parameters(vocab_size, size + 1, num_layers) <= parameters:
        size += 1
    return size


def load_ptb(folder: str) -> Corpus:
    return load_corpus(dataset_from_dict({"path": str(Path(folder).resolve()), "format": "ptb"}))


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


@torch.no_grad()
def reference_loss(model: ReferenceModel, stream: Tensor) -> float:
    """Mean token cross-entropy, dropout off, the same streams and windows as trainers.cross_entropy."""
    model.eval()
    total, count = 0.0, 0
    state = model.initial_state(EVAL_BATCH_SIZE)
    for inputs, targets in windows(batchify(stream, EVAL_BATCH_SIZE), EVAL_BPTT):
        logits, state = model(inputs, state)
        total += nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").double().item()
        count += targets.numel()
    model.train()
    return total / count


def train_reference(corpus: Corpus, eval_text: Tensor, budget_seconds: float, eval_every: float,
                    parameters: int) -> dict[str, Any]:
    """pytorch/examples training: the learning rate is divided by `anneal` after an epoch whose validation
    loss does not improve on the best epoch's. Between epochs it is also evaluated every `eval_every`
    seconds of training for the curve (those evaluations anneal nothing)."""
    settings = REFERENCE_SETTINGS
    vocab_size = len(corpus.vocabulary)
    size = reference_size(vocab_size, parameters, settings["num_layers"])
    torch.manual_seed(0)
    model = ReferenceModel(vocab_size, size, settings["num_layers"], settings["dropout"], settings["init_range"])
    batched = batchify(corpus.train, settings["batch_size"])
    learning_rate, best_loss, best_epoch_loss = settings["learning_rate"], math.inf, math.inf
    best_weights = early_weights = copy.deepcopy(model.state_dict())
    curve: list[dict[str, Any]] = []
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    since_eval, loss_sum, tokens, epochs, finished = 0.0, 0.0, 0, 0, False
    per_epoch = math.ceil((batched.shape[0] - 1) / settings["bptt"])
    while not finished:
        state = model.initial_state(settings["batch_size"])  # every epoch starts from zeros
        for window, (inputs, targets) in enumerate(windows(batched, settings["bptt"]), start=1):
            step_started = time.perf_counter()
            state = tuple(tensor.detach() for tensor in state)
            model.zero_grad()
            logits, state = model(inputs, state)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), settings["clip"])
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(param.grad, alpha=-learning_rate)
            loss_sum, tokens = loss_sum + loss.item() * targets.numel(), tokens + targets.numel()
            since_eval += time.perf_counter() - step_started
            finished = time.perf_counter() - wall_started >= budget_seconds
            if since_eval < eval_every and not finished:
                continue
            val_loss = reference_loss(model, eval_text)
            if val_loss < best_loss:
                best_loss, best_weights = val_loss, copy.deepcopy(model.state_dict())
            wall = time.perf_counter() - wall_started
            if wall <= EARLY_SECONDS:
                early_weights = best_weights
            curve.append(dict(wall_seconds=wall, cpu_seconds=time.process_time() - cpu_started,
                              val_ppl=perplexity(val_loss), best_val_ppl=perplexity(best_loss),
                              train_ppl=perplexity(loss_sum / tokens), learning_rate=learning_rate,
                              epochs=epochs + window / per_epoch))
            since_eval, loss_sum, tokens = 0.0, 0.0, 0
            if finished:
                break
        if not finished:  # the epoch ended: pytorch/examples' annealing rule
            epoch_loss = reference_loss(model, eval_text)
            if epoch_loss < best_epoch_loss:
                best_epoch_loss = epoch_loss
            else:
                learning_rate /= settings["anneal"]
        epochs += 1
    full = {}
    for name, weights in (("early", early_weights), ("end", best_weights)):
        model.load_state_dict(weights)
        full[name] = perplexity(reference_loss(model, corpus.valid))
    configuration = dict(settings, emsize=size, nhid=size, eval_every_seconds=eval_every,
                         anneal_when="after an epoch whose validation loss does not improve on the best epoch's")
    parameters = sum(p.numel() for p in model.parameters())
    assert parameters == reference_parameters(vocab_size, size, settings["num_layers"])
    return dict(configuration=configuration, parameters=parameters, curve=curve, full_valid_ppl=full)


def our_model_config(name: str, vocab_size: int, budget: int, overrides: dict[str, Any]) -> ModelConfig:
    fields = OUR_MODEL_FIELDS[name] | {key: value for key, value in overrides.items() if key not in OUR_TRAINING}
    return solve_hidden_size(ModelConfig(vocab_size=vocab_size, hidden_size=1, **fields), budget)


def our_training_config(budget_seconds: float | None, steps_per_turn: int, overrides: dict[str, Any],
                        budget_steps: int | None = None) -> TrainingConfig:
    settings = OUR_TRAINING | {key: value for key, value in overrides.items() if key in OUR_TRAINING}
    schedule = Schedule(budget_seconds=budget_seconds, budget_steps=budget_steps, clock="wall",
                        steps_per_turn=steps_per_turn,
                        batch_size=settings["batch_size"], bptt=settings["bptt"], eval_batch_size=EVAL_BATCH_SIZE,
                        max_grad_norm=settings["max_grad_norm"], averaging=TwoTailedAveragingConfig())
    return TrainingConfig(schedule=schedule, learning_rate=settings["learning_rate"],
                          l2_penalty=settings["l2_penalty"], seed=0)


def seconds_per_step(model_config: ModelConfig, training: TrainingConfig, corpus: Corpus) -> float:
    """Time three training steps (after one to warm up) of a throwaway run of the same shape."""
    run = TrainingRun(model_config, replace_schedule(training, steps_per_turn=1), corpus, torch.device("cpu"))
    run.train_turn()
    run.schedule = run.schedule.model_copy(update={"steps_per_turn": 3})
    started = time.perf_counter()
    run.train_turn()
    return (time.perf_counter() - started) / 3


def replace_schedule(config: TrainingConfig, **fields: Any) -> TrainingConfig:
    return config.model_copy(update={"schedule": config.schedule.model_copy(update=fields)})


def train_ours(name: str, corpus: Corpus, eval_text: Tensor, budget_seconds: float, eval_every: float,
               parameter_budget: int, overrides: dict[str, Any], steps: int | None = None,
               steps_per_turn: int = 100) -> dict[str, Any]:
    model_config = our_model_config(name, len(corpus.vocabulary), parameter_budget, overrides)
    if steps is not None:  # a step budget: the same numbers whatever else the machine is doing
        config = our_training_config(None, steps_per_turn, overrides, budget_steps=steps)
    else:
        step_seconds = seconds_per_step(model_config, our_training_config(1e9, 1, overrides), corpus)
        config = our_training_config(budget_seconds, max(1, round(eval_every / step_seconds)), overrides)
    steps_per_turn = config.schedule.steps_per_turn
    curve: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        best, early = Path(folder) / "best.pt", Path(folder) / "early.pt"

        def on_turn(report: TurnReport) -> None:
            curve.append(_turn_point(report))
            if report.improved and report.wall_seconds <= EARLY_SECONDS:
                early.write_bytes(best.read_bytes())

        result = train(model_config, config, replace(corpus, valid=eval_text), checkpoint_path=best,
                       on_turn=on_turn, device=torch.device("cpu"))
        full = {label: perplexity(cross_entropy(load_checkpoint(path).model, corpus.valid, EVAL_BATCH_SIZE, EVAL_BPTT))
                for label, path in (("early", early if early.exists() else best), ("end", best))}
    return dict(configuration=dict(model=model_config.to_dict(), training=config.model_dump()),
                parameters=result.parameter_count, steps_per_turn=steps_per_turn, curve=curve, full_valid_ppl=full)


def _turn_point(report: TurnReport) -> dict[str, Any]:
    return dict(wall_seconds=report.wall_seconds, cpu_seconds=report.process_seconds,
                val_ppl=perplexity(report.val_loss), best_val_ppl=perplexity(report.best_val_loss),
                train_ppl=perplexity(report.train_loss), averaging_length=report.averaging_length,
                step=report.step, epochs=report.epochs, tokens_per_second=report.tokens_per_second)


def run_model(name: str, data: str, minutes: float, threads: int, cores: list[int] | None, eval_every: float,
              eval_tokens: int, parameter_budget: int, reference_parameters_target: int,
              overrides: dict[str, Any], steps: int | None = None, steps_per_turn: int = 100) -> dict[str, Any]:
    """Train one model on `threads` threads (pinned to `cores` when given) and return its record."""
    set_threads(threads)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    corpus = load_ptb(data)
    eval_text = corpus.valid[:eval_tokens]
    budget = minutes * 60
    if name == "reference":
        record = train_reference(corpus, eval_text, budget, eval_every, reference_parameters_target)
    else:
        record = train_ours(name, corpus, eval_text, budget, eval_every, parameter_budget, overrides, steps,
                            steps_per_turn)
    return dict(record, cores=sorted(os.sched_getaffinity(0)), torch_threads=torch.get_num_threads(),
                summary=summarise(record))


def set_threads(threads: int) -> None:
    """OpenMP/MKL variables (read by child processes and late-starting pools) and torch's own setting."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    torch.set_num_threads(threads)


def summarise(record: dict[str, Any]) -> dict[str, Any]:
    """Perplexity at 3.5 minutes (last evaluation at or before 210 s) and at the end."""
    curve = record["curve"]
    early = [point for point in curve if point["wall_seconds"] <= EARLY_SECONDS]
    return {
        "at_3_5_minutes": _point_summary(early[-1]) if early else None,
        "at_end": _point_summary(curve[-1]),
        "full_valid_ppl_of_best_weights_at_3_5_minutes": record["full_valid_ppl"]["early"],
        "full_valid_ppl_of_best_weights_at_end": record["full_valid_ppl"]["end"],
    }


def _point_summary(point: dict[str, Any]) -> dict[str, Any]:
    return {key: point[key] for key in ("wall_seconds", "cpu_seconds", "val_ppl", "best_val_ppl")}


def machine(threads: int) -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "torch_threads_per_model": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def core_sets(models: list[str], threads: int, parallel: bool, first_core: int = 0) -> list[list[int]]:
    """From the `first_core`-th usable core on: `threads` cores for the first model, the next `threads`
    for the second, ... (in parallel); the same first `threads` for every model one after another otherwise."""
    usable = sorted(os.sched_getaffinity(0))[first_core:]
    needed = threads * (len(models) if parallel else 1)
    if len(usable) < needed:
        mode = f"{len(models)} models in parallel" if parallel else "one model"
        raise SystemExit(f"ptb_short: {mode} at --threads {threads} need {needed} cores; this process may use "
                         f"{len(usable)} ({usable}). Use fewer --models or --threads, or drop --parallel.")
    return [usable[threads * index if parallel else 0:][:threads] for index in range(len(models))]


def run_all(models: list[str], parallel: bool, cores: list[list[int]], **arguments: Any) -> dict[str, Any]:
    if not parallel:
        return {name: run_model(name, cores=core, **arguments) for name, core in zip(models, cores, strict=True)}
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(arguments["threads"])  # before spawning
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(models), maxtasksperchild=1) as pool:
        pending = {name: pool.apply_async(run_model, (name,), dict(arguments, cores=core))
                   for name, core in zip(models, cores, strict=True)}
        return {name: result.get() for name, result in pending.items()}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget per model (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (and cores) per model (default 2)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--parallel", action="store_true",
                        help="run the models at once, each in its own process pinned to its own --threads cores")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed)")
    parser.add_argument("--eval-every", type=float, default=25.0,
                        help="seconds of training between validation evaluations (default 25)")
    parser.add_argument("--eval-tokens", type=int, default=10_000,
                        help="validation prefix scored during training (default 10000 of 73760)")
    parser.add_argument("--parameter-budget", type=int, default=4_000_000, help="our models' budget (default 4M)")
    parser.add_argument("--reference-parameters", type=int, default=3_600_000,
                        help="the reference's size: largest emsize = nhid within this count (default 3.6M)")
    parser.add_argument("--first-core", type=int, default=0,
                        help="skip this many cores (to run several invocations side by side)")
    parser.add_argument("--steps", type=int,
                        help="our models train this many steps instead of --minutes (deterministic: for before/after "
                             "comparisons of a change on a busy machine); the reference model cannot be run with it")
    parser.add_argument("--steps-per-turn", type=int, default=100,
                        help="with --steps: steps between validation evaluations (default 100)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                        help="override a fixed setting of our models (a training setting such as learning_rate "
                             "or batch_size, or a model field such as input_embedding_ratio); repeatable")
    arguments = parser.parse_args(argv)
    arguments.overrides = parse_overrides(parser, arguments.overrides)
    unknown = sorted(set(arguments.models.split(",")) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {','.join(unknown)}; allowed: {','.join(MODELS)}")
    if arguments.steps is not None and "reference" in arguments.models.split(","):
        parser.error("--steps: the reference model trains for --minutes only; leave it out of --models")
    return arguments


def parse_overrides(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, Any]:
    """`FIELD=VALUE` pairs, values read as JSON where they parse (numbers, true/false), else as text."""
    overrides: dict[str, Any] = {}
    for item in items:
        field, separator, value = item.partition("=")
        if not separator:
            parser.error(f"--set {item}: expected FIELD=VALUE")
        allowed = [*OUR_TRAINING, *ModelConfig.__dataclass_fields__]
        if field not in allowed:
            parser.error(f"--set {field}: unknown; allowed: {', '.join(allowed)}")
        try:
            overrides[field] = json.loads(value)
        except json.JSONDecodeError:
            overrides[field] = value
    return overrides


def main(argv: list[str] | None = None) -> dict[str, Any]:
    arguments = parse_arguments(argv)
    models = arguments.models.split(",")
    cores = core_sets(models, arguments.threads, arguments.parallel, arguments.first_core)
    load_before = os.getloadavg()
    records = run_all(models, arguments.parallel, cores, data=arguments.data, minutes=arguments.minutes,
                      threads=arguments.threads, eval_every=arguments.eval_every, eval_tokens=arguments.eval_tokens,
                      parameter_budget=arguments.parameter_budget,
                      reference_parameters_target=arguments.reference_parameters, overrides=arguments.overrides,
                      steps=arguments.steps, steps_per_turn=arguments.steps_per_turn)
    output = {
        "benchmark": "ptb_short",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": dict(machine(arguments.threads), load_average_before=load_before,
                        load_average_after=os.getloadavg()),
        "settings": {
            "minutes": None if arguments.steps else arguments.minutes,
            "steps": arguments.steps,
            "steps_per_turn": arguments.steps_per_turn if arguments.steps else None,
            "parallel": arguments.parallel,
            "clock": ("a step budget: wall and CPU seconds are recorded, not budgeted" if arguments.steps else
                      "wall-clock seconds from the start of each run; evaluations count inside the budget"),
            "eval_every_seconds_of_training": arguments.eval_every,
            "eval_tokens_during_training": min(arguments.eval_tokens, int(load_ptb(arguments.data).valid.numel())),
            "valid_tokens": int(load_ptb(arguments.data).valid.numel()),
            "eval_batch_size": EVAL_BATCH_SIZE,
            "eval_bptt": EVAL_BPTT,
            "full_valid_rescoring": "after training, outside the budget: best weights as of 210 s and as of the end",
            "our_hyperparameters": dict(OUR_TRAINING, model_fields=OUR_MODEL_FIELDS,
                                        parameter_budget=arguments.parameter_budget),
            "overrides": arguments.overrides,
            "why": OUR_SETTINGS_REASONS,
        },
        "models": records,
    }
    emit_json(output, arguments.output, indent=1)
    return output


if __name__ == "__main__":
    main(sys.argv[1:])
