"""The training loop: turns of optimisation steps, each followed by a validation evaluation (of the
whole validation split, or of its first `validation_tokens` tokens; each report says which, and how
long the turn spent training and evaluating).

The best validation score over turns is the run's result, and the weights that scored it (averaged
ones when an averaging strategy reports them) are kept as the best checkpoint. Progress leaves
through a callback, so this module knows nothing about who listens.

A run is budgeted in turns, steps, epochs or wall-clock seconds. When the loss becomes NaN or
infinite, the run goes back to the state it had at the end of the last good turn, lowers the
learning rate to 0.9^k of the configured one at the k-th divergence (Melis thesis, section 4.4), draws
fresh dropout noise and carries on, at most `divergence_retries` times; then it fails with the
reason. After every turn the whole training state can be written to a latest checkpoint, from
which `train(..., resume_from=...)` continues to exactly the numbers of an uninterrupted run.

When the schedule enables fine-tuning (`fine_tuning`), the budget's last turn is followed by
fine-tuning turns from the best weights, reported like the others (with `fine_tuning` set), until
its trigger fires or its own budget is used.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lm_tuner.models import ModelConfig, count_parameters
from lm_tuner.models.cpu_kernels import cpu_extension
from lm_tuner.trainers.averaging_protocol import Evaluated
from lm_tuner.trainers.checkpoint import save_checkpoint
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.reverse_copy_scores import ReverseCopyScores, reverse_copy_scores, whole_examples
from lm_tuner.trainers.training_config import TrainingConfig
from lm_tuner.trainers.training_reports import TrainingResult, TurnCallback, TurnReport
from lm_tuner.trainers.training_run import LEARNING_RATE_BACKOFF, Diverged, TrainingRun
from lm_tuner.trainers.weight_swap import swapped_weights


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite and restarting from the last good state did not help."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(
    model_config: ModelConfig,
    config: TrainingConfig,
    corpus: Corpus,
    *,
    checkpoint_path: Path | None = None,
    latest_checkpoint_path: Path | None = None,
    resume_from: Path | None = None,
    metadata: dict[str, Any] | None = None,
    on_turn: TurnCallback | None = None,
    device: torch.device | None = None,
    stop_at_step: int | None = None,
    report_restored: bool = False,
) -> TrainingResult:
    """Train within the schedule's budget; keep the best-validation weights at `checkpoint_path`.

    `latest_checkpoint_path` receives the full training state after every turn; `resume_from` (such
    a file) continues that run, which must have the same model and training configuration. `stop_at_step` pauses
    the run after the turn that reaches that step (a rung of successive halving): resumed from its latest state,
    it goes on exactly as a run that never paused. With `report_restored`, a resumed run first tells `on_turn` the
    turns it restored (whoever listens may have missed the last of them when the run stopped).
    """
    set_up = time.perf_counter()
    run = TrainingRun(model_config, config, corpus, device or default_device())
    if resume_from is not None:
        run.resume(Path(resume_from))
    if run.device.type == "cpu":
        cpu_extension()  # loaded (built, the first time on a machine) here rather than inside the first step
    setup_seconds = time.perf_counter() - set_up
    metadata = metadata or {}
    if report_restored and on_turn is not None:
        for restored in run.reports:
            on_turn(restored)
    last_good = run.state_dict()
    finished = run.finished()
    while not finished and (stop_at_step is None or run.step < stop_at_step):
        run.start_fine_tuning_when_due()
        try:
            started = time.perf_counter()
            train_loss, tokens_per_second = run.train_turn()
            trained = time.perf_counter()
            evaluated = run.evaluate()
            memory = reversed_half_scores(run, evaluated)
            train_seconds, eval_seconds = trained - started, time.perf_counter() - trained
        except Diverged as divergence:
            if run.divergences == config.schedule.divergence_retries:
                raise TrainingDiverged(
                    f"training diverged: {divergence}; gave up after {run.divergences} restart(s) from the last "
                    f"good state, each with the learning rate x{LEARNING_RATE_BACKOFF}; lower learning_rate or "
                    f"raise divergence_retries"
                ) from None
            run.recover(last_good)
            continue
        improved = evaluated.loss < run.best_val_loss
        finished = run.finished()
        if improved:
            run.record_best(evaluated)
        report = TurnReport(
            run.turn, run.step, train_loss, evaluated.loss, run.best_val_loss, improved, tokens_per_second,
            run.stopwatch.wall(), process_seconds=run.stopwatch.process(), averaging_length=evaluated.length,
            learning_rate=run.learning_rate, divergences=run.divergences, epochs=run.stream.epochs, final=finished,
            train_seconds=train_seconds, eval_seconds=eval_seconds, val_tokens=run.validation_tokens,
            val_subset=run.validation_subset,
            reversed_loss=memory and memory.reversed_loss, reversed_accuracy=memory and memory.reversed_accuracy,
            val_logit_scale=evaluated.logit_scale, setup_seconds=setup_seconds, fine_tuning=run.fine_tuning,
            tokens=run.tokens,
        )
        run.reports.append(report)
        last_good = run.state_dict()
        turn_metadata = {**metadata, "val_loss": evaluated.loss, "val_logit_scale": evaluated.logit_scale,
                         "val_tokens": run.validation_tokens,
                         "val_subset": run.validation_subset, "turn": run.turn, "step": run.step,
                         "averaging_length": evaluated.length, "fine_tuning": report.fine_tuning,
                         "training": config.model_dump()}
        saving, best = time.perf_counter(), None
        with swapped_weights(run.model, evaluated.weights):
            if improved and checkpoint_path is not None:
                best = save_checkpoint(checkpoint_path, run.model, corpus.vocabulary, turn_metadata)
            if latest_checkpoint_path is not None:
                save_checkpoint(latest_checkpoint_path, run.model, corpus.vocabulary, turn_metadata,
                                training_state=last_good)
        # the saved state holds this report as it was before the writes: only the callback learns them
        report = run.reports[-1] = replace(report, checkpoint_seconds=time.perf_counter() - saving,
                                           checkpoint_sha256=best and best.sha256, checkpoint_bytes=best and best.size)
        setup_seconds = 0.0
        if on_turn is not None:
            on_turn(report)
    return TrainingResult(run.best_val_loss, run.best_turn, count_parameters(model_config), list(run.reports))


def reversed_half_scores(run: TrainingRun, evaluated: Evaluated) -> ReverseCopyScores | None:
    """On a reverse-copy task, the evaluated weights' scores on the reversed halves of the whole examples among the
    validation tokens the turn scores (one more pass over them); None on other corpora."""
    length = run.corpus.reverse_copy_length
    if length is None:
        return None
    schedule = run.schedule
    examples = whole_examples(run.corpus.valid, length, schedule.validation_tokens)
    streams = min(schedule.eval_batch_size, examples.numel() // (2 * length + 2))
    with swapped_weights(run.model, evaluated.weights):
        return reverse_copy_scores(run.model, examples, length, batch_size=streams, bptt=schedule.bptt,
                                   logit_scale=evaluated.logit_scale)
