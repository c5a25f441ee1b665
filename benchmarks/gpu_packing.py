"""Packing trials on one GPU: training tokens/s of one full-size trial alone, and of 2 and 4 sharing the GPU.

Each trial is what the tuner runs for `--space` (default: the paper's 24M-parameter Mogrifier LSTM on
PTB, batch 64, BPTT 70, Adam): the model solved to the spec's budget by `lm_tuner.tuner.spec.space.trial_setup`,
trained by `trainers.TrainingRun`, in its own process — what Ray does with `gpus_per_trial: 1/N`.
Every configuration runs for `--seconds` after a warm-up; GPU utilisation and memory are sampled
through NVML meanwhile. The best packing is the one with the highest total tokens/s, and the full
study's GPU-hours are projected from it (training only: evaluation passes and stage 2 are extra).

    PYTHONPATH=. python benchmarks/gpu_packing.py --data DIR_WITH_PTB --output benchmarks/results/gpu_packing.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks.cell_throughput import emit_json
from lm_tuner.trainers import load_corpus
from lm_tuner.trainers.training_run import TrainingRun
from lm_tuner.tuner.spec import StudySpec, load_spec
from lm_tuner.tuner.spec.space import trial_setup

# A mid-range point of Table 2.4, near the paper's best Mogrifier on PTB; throughput barely depends on it.
TRIAL_PARAMS = {
    "learning_rate": 0.0025, "l2_penalty": 1e-4, "input_embedding_ratio": 1.0, "input_dropout": 0.6,
    "inter_layer_dropout": 0.3, "state_dropout": 0.2, "output_dropout": 0.4,
    "mogrifier_rounds": 6, "mogrifier_rank": 40,
}


def local_spec(space: Path, data: Path) -> StudySpec:
    """The spec with its dataset replaced by the same format read from a local folder."""
    spec = load_spec(space)
    dataset = {"path": str(data), "format": spec.dataset.name}
    return StudySpec.model_validate(spec.model_dump(mode="json") | {"dataset": dataset})


def train_for(spec_json: dict[str, Any], family: str, warmup: float, seconds: float, start: Any,
              results: Any) -> None:
    """One trial's process: warm up, wait for the others, then count tokens for `seconds`."""
    torch.set_num_threads(1)
    spec = StudySpec.model_validate(spec_json)
    corpus = load_corpus(spec.dataset)
    params = {name: value for name, value in TRIAL_PARAMS.items() if name in spec.searched_for(family)}
    setup = trial_setup(spec, family, params, len(corpus.vocabulary), seed=0)
    run = TrainingRun(setup.model, setup.training, corpus, torch.device("cuda"))
    tokens_per_step = spec.training.batch_size * spec.training.bptt
    began = time.perf_counter()
    while time.perf_counter() - began < warmup:
        run._step(*run.stream.next_window()[:2])
    start.wait()
    torch.cuda.synchronize()
    began, steps = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        run._step(*run.stream.next_window()[:2])  # `_step` ends with .item(): every step is synchronised
        steps += 1
    elapsed = time.perf_counter() - began
    results.put({"tokens_per_second": steps * tokens_per_step / elapsed, "steps": steps,
                 "parameters": sum(p.numel() for p in run.params), "hidden_size": setup.model.hidden_size,
                 "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30})


class GpuSampler:
    """Samples NVML utilisation and memory of GPU 0 every `interval` seconds on a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle, self.interval = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0), interval
        self.utilisation: list[float] = []
        self.memory_gib: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.utilisation.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            self.memory_gib.append(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**30)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def measure_packing(spec: StudySpec, family: str, concurrent: int, warmup: float, seconds: float) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(concurrent + 1), context.Queue()
    processes = [context.Process(target=train_for, args=(spec.model_dump(mode="json"), family, warmup, seconds,
                                                          start, results)) for _ in range(concurrent)]
    for process in processes:
        process.start()
    start.wait()
    with GpuSampler() as sampler:
        trials = [results.get() for _ in processes]
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a trial process of the {concurrent}-way packing exited with {process.exitcode}")
    per_trial = [trial["tokens_per_second"] for trial in trials]
    return {
        "concurrent_trials": concurrent,
        "gpu_fraction_per_trial": 1 / concurrent,
        "tokens_per_second_per_trial": per_trial,
        "tokens_per_second_total": sum(per_trial),
        "gpu_utilisation_percent_mean": statistics.fmean(sampler.utilisation) if sampler.utilisation else None,
        "gpu_memory_used_gib_max": max(sampler.memory_gib, default=None),
        "trial_peak_memory_gib": max(trial["peak_memory_gib"] for trial in trials),
        "parameters": trials[0]["parameters"],
        "hidden_size": trials[0]["hidden_size"],
    }


def projected_gpu_hours(study: StudySpec, corpus_train_tokens: int, tokens_per_second: float) -> dict[str, Any]:
    """Training tokens of every tuning trial and rerun of every family, at the measured total rate."""
    schedule = study.training
    if schedule.budget_epochs is None:
        raise ValueError("training.budget_epochs: the projection needs an epoch budget")
    trials_per_family = study.tuning.trials + (study.reruns.top * study.reruns.seeds if study.reruns else 0)
    tokens = len(study.families) * trials_per_family * schedule.budget_epochs * corpus_train_tokens
    return {
        "study": study.name,
        "families": list(study.families),
        "trials_per_family_including_reruns": trials_per_family,
        "training_tokens": tokens,
        "gpu_hours": tokens / tokens_per_second / 3600,
        "assumes": "every trial trains its full epoch budget (no early stopping) at the packed family's rate "
                   "(the LSTM is faster than the Mogrifier); evaluation and stage 2 not counted",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    parser.add_argument("--space", type=Path, default=Path("spaces/mogrifier_ptb.yaml"), help="the trial to pack")
    parser.add_argument("--project", type=Path, default=Path("spaces/ptb_comparison.yaml"),
                        help="the study whose GPU-hours are projected")
    parser.add_argument("--family", default="mogrifier")
    parser.add_argument("--packings", default="1,2,4", help="concurrent trials per GPU, comma-separated")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of training before timing")
    parser.add_argument("--seconds", type=float, default=45.0, help="timed seconds per packing")
    parser.add_argument("--output", type=Path, help="write the JSON result here (also printed)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU visible: this benchmark measures GPU packing")
    spec = local_spec(args.space, args.data)
    rows = [measure_packing(spec, args.family, int(n), args.warmup, args.seconds) for n in args.packings.split(",")]
    best = max(rows, key=lambda row: row["tokens_per_second_total"])
    alone = rows[0]["tokens_per_second_total"]
    for row in rows:
        row["total_vs_alone"] = row["tokens_per_second_total"] / alone
    corpus = load_corpus(spec.dataset)
    study = local_spec(args.project, args.data)
    result = {
        "benchmark": "gpu_packing",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "cudnn": torch.backends.cudnn.version(), "logical_cpus": os.cpu_count()},
        "trial": {"space": str(args.space), "family": args.family, "params": TRIAL_PARAMS,
                  "batch_size": spec.training.batch_size, "bptt": spec.training.bptt,
                  "optimizer": spec.training.optimizer, "warmup_seconds": args.warmup, "timed_seconds": args.seconds},
        "packings": rows,
        "best_packing": best["concurrent_trials"],
        "projection": projected_gpu_hours(study, len(corpus.train), best["tokens_per_second_total"])
        | {"at_packing": best["concurrent_trials"]},
    }
    emit_json(result, args.output)


if __name__ == "__main__":
    main()
