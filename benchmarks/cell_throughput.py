"""Training throughput of our recurrent families against torch.nn.LSTM (oneDNN on CPU, cuDNN on GPU).

Every model is a language model with the same embedding, tied softmax and shapes (E=H=512, 2 layers;
Mogrifier r=5, k=40); only the recurrent layers differ. Two setups: word level (V=10000, batch 32,
BPTT 35; the result file's top-level keys) and character level (V=205, batch 128, BPTT 150, the
PTB-char setting; under "character_level", skipped with --word-only). One training step is forward,
cross-entropy and backward (the optimizer update, the same for every model, is left out). Models take
turns within each round, so machine load hits them alike; ratios are taken within a round and the
median over rounds is reported.

Achieved FLOP/s counts matrix multiplies only: 2 FLOPs per weight applied per token in the forward
pass, times 3 for forward plus backward. Element-wise work (gates, mogrifier scaling) is not counted,
so a model only scores well by doing its matrix work fast.

    PYTHONPATH=. python benchmarks/cell_throughput.py --output benchmarks/results/cell_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.models.cuda_graphs import run_layer
from lm_tuner.models.recurrence import RecurrentLayer
from lm_tuner.trainers.heap import keep_freed_memory

HIDDEN, LAYERS, ROUNDS, RANK = 512, 2, 5, 40


@dataclass(frozen=True)
class Setup:
    vocab_size: int
    batch: int
    bptt: int


WORD, CHARACTER = Setup(vocab_size=10_000, batch=32, bptt=35), Setup(vocab_size=205, batch=128, bptt=150)
FAMILY_FIELDS = {
    "lstm": {},
    "mogrifier": dict(mogrifier_rounds=ROUNDS, mogrifier_rank=RANK),
    "rlstm": {},
    "mogrifier_rlstm": dict(mogrifier_rounds=ROUNDS, mogrifier_rank=RANK),
    "mlstm": {},
}


def config_for(family: str, vocab_size: int = WORD.vocab_size) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, hidden_size=HIDDEN, family=family, num_layers=LAYERS,
                       **FAMILY_FIELDS[family])


class TorchLSTMLanguageModel(nn.Module):
    """The reference: the same embedding and tied softmax around torch.nn.LSTM."""

    def __init__(self, vocab_size: int = WORD.vocab_size) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, HIDDEN)
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, LAYERS)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, tokens: Tensor) -> Tensor:
        outputs, _ = self.lstm(self.embedding(tokens))
        return nn.functional.linear(outputs, self.embedding.weight, self.output_bias)


class OurLanguageModel(nn.Module):
    def __init__(self, family: str, fast: bool = True, vocab_size: int = WORD.vocab_size) -> None:
        super().__init__()
        self.model = LanguageModel(config_for(family, vocab_size))
        for layer in self.model.layers:
            layer.fast = fast

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens, self.model.initial_state(tokens.shape[1]))[0]


def matmul_flops_per_token(model: nn.Module) -> int:
    """Forward matrix-multiply FLOPs per token: every recurrent weight once, plus the softmax."""
    if isinstance(model, TorchLSTMLanguageModel):
        recurrent = sum(p.numel() for name, p in model.lstm.named_parameters() if name.startswith("weight"))
    else:
        recurrent = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, nn.Linear))
    embedding = model.embedding if isinstance(model, TorchLSTMLanguageModel) else model.model.embedding
    return 2 * (recurrent + embedding.weight.numel())  # the tied softmax applies the embedding's weights


def training_step(model: nn.Module, tokens: Tensor, targets: Tensor) -> Callable[[], None]:
    def step() -> None:
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.reshape(-1)) * len(tokens)
        model.zero_grad(set_to_none=True)
        loss.backward()
    return step


def recurrent_step(layers: Callable[[Tensor], Tensor], inputs: Tensor, grad: Tensor) -> Callable[[], None]:
    def step() -> None:
        layers(inputs).backward(grad)
    return step


def our_recurrent_stack(family: str, device: torch.device) -> Callable[[Tensor], Tensor]:
    """The family's layers as training runs them: on a GPU each window replays a CUDA graph (models.cuda_graphs)."""
    layers = nn.ModuleList(RecurrentLayer(config_for(family), layer) for layer in range(LAYERS)).to(device)

    def run(inputs: Tensor) -> Tensor:
        zeros = inputs.new_zeros(inputs.shape[1], HIDDEN)
        for layer in layers:
            inputs, _ = run_layer(layer, inputs, (zeros, zeros), None, use_graphs=True)
        return inputs
    return run


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
WARMUP_NOTE = {
    "cpu": "the first window builds the C++ kernels (models/csrc/cpu_kernels.cpp) with the machine's compiler "
           "into TORCH_EXTENSIONS_DIR (cached on disk, so a second process loads them)",
    "cuda": "the first training step compiles the fused mogrifier kernels with Triton (models.mogrifier_kernels; "
            "cached on disk, so a second process loads them) and captures a CUDA graph per layer and window "
            "shape (models.cuda_graphs)",
}


def time_in_turns(steps: dict[str, Callable[[], None]], rounds: int, device: torch.device,
                  clock: Callable[[], float]) -> dict[str, list[float]]:
    """Seconds per step of every entry, taking turns within each round after one untimed step each."""
    for step in steps.values():
        step()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            synchronize(device)
            started = clock()
            step()
            synchronize(device)
            seconds[name].append(clock() - started)
    return seconds


def summarise(seconds: dict[str, list[float]], flops: dict[str, int], reference: str, tokens: int
              ) -> dict[str, dict]:
    reference_best = flops[reference] / min(seconds[reference])
    rows = {}
    for name, times in seconds.items():
        per_round = [(flops[name] / t) / (flops[reference] / r) for t, r in zip(times, seconds[reference], strict=True)]
        median = statistics.median(times)
        rows[name] = {
            "step_seconds_median": median,
            "step_seconds_min": min(times),
            "tokens_per_second": tokens / median,
            "matmul_flops_per_step": flops[name],
            "achieved_flops_per_second": flops[name] / median,
            "efficiency_vs_reference": statistics.median(per_round),
            "efficiency_vs_reference_best_times": (flops[name] / min(times)) / reference_best,
        }
    return rows


def measure_warmup(family: str, device: str, threads: int, precision: str) -> dict[str, float]:
    """First training steps of a model in fresh processes sharing new Triton and C++ extension caches.

    In the first process (cold) and a second model in it (warm), then in a second process (a later
    trial on the same machine, which finds the compiled kernels on disk).
    """
    code = (
        "import json, sys, time, torch\n"
        "sys.path.insert(0, '.')\n"
        f"torch.set_num_threads({threads})\n"
        f"torch.set_float32_matmul_precision('{precision}')\n"
        "from benchmarks.cell_throughput import OurLanguageModel, training_step, synchronize, WORD\n"
        f"device = torch.device('{device}')\n"
        "tokens = torch.randint(WORD.vocab_size, (WORD.bptt, WORD.batch), device=device)\n"
        "result = {}\n"
        "for run in ('cold', 'warm'):\n"
        f"    model = OurLanguageModel('{family}').to(device)\n"
        "    step = training_step(model, tokens, tokens)\n"
        "    times = []\n"
        "    for _ in range(6):\n"
        "        synchronize(device); started = time.perf_counter(); step(); synchronize(device)\n"
        "        times.append(time.perf_counter() - started)\n"
        "    result[run + '_first_step_seconds'] = times[0]\n"
        "    result[run + '_later_step_seconds'] = min(times[1:])\n"
        "print(json.dumps(result))\n"
    )
    result = {}
    with tempfile.TemporaryDirectory() as cache:
        for process in ("first_process", "second_process"):
            output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent.parent,
                                    env=os.environ | {"TRITON_CACHE_DIR": cache, "TORCH_EXTENSIONS_DIR": cache})
            runs = json.loads(output.stdout.strip().splitlines()[-1])
            for run in ("cold", "warm"):
                runs[run + "_warmup_seconds"] = runs[run + "_first_step_seconds"] - runs[run + "_later_step_seconds"]
            result[process] = runs
    return result


def emit_json(result: dict[str, Any], output: Path | None, indent: int = 2) -> None:
    """Prints a benchmark's JSON result and, given a path, writes it there too."""
    text = json.dumps(result, indent=indent)
    print(text)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")


def describe_cpu() -> dict[str, object]:
    """The CPU's model, by name and by family/model/stepping ("model name" alone can be just "AMD EPYC")."""
    cpu: dict[str, str] = {}
    if Path("/proc/cpuinfo").exists():  # the first processor's fields
        for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            cpu[key] = value
    return {
        "cpu": cpu.get("model name") or platform.processor() or platform.machine(),
        "cpu_family_model_stepping": "/".join(cpu.get(key, "?") for key in ("cpu family", "model", "stepping")),
        "avx512": "avx512f" in cpu.get("flags", "").split(),
    }


def describe_machine(device: torch.device, threads: int) -> dict[str, object]:
    machine: dict[str, object] = {
        **describe_cpu(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": threads,
        "torch": torch.__version__,
        "onednn": torch.backends.mkldnn.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
        machine["cudnn"] = torch.backends.cudnn.version()
    return machine


REFERENCE = "torch.nn.LSTM"


def measure_setup(setup: Setup, device: torch.device, rounds: int, clock: Callable[[], float]
                  ) -> dict[str, dict]:
    """Whole language models, then the recurrent layers alone, each against torch.nn.LSTM in the same rounds."""
    models: dict[str, nn.Module] = {REFERENCE: TorchLSTMLanguageModel(setup.vocab_size)}
    models |= {family: OurLanguageModel(family, vocab_size=setup.vocab_size) for family in FAMILY_FIELDS}
    models["mogrifier (reference path: autograd through a per-step loop)"] = OurLanguageModel(
        "mogrifier", fast=False, vocab_size=setup.vocab_size)
    tokens = torch.randint(setup.vocab_size, (setup.bptt, setup.batch), device=device)
    targets = torch.randint(setup.vocab_size, (setup.bptt, setup.batch), device=device)
    steps = {name: training_step(model.to(device), tokens, targets) for name, model in models.items()}
    per_step = setup.batch * setup.bptt
    flops = {name: 3 * per_step * matmul_flops_per_token(model) for name, model in models.items()}
    language_models = summarise(time_in_turns(steps, rounds, device, clock), flops, REFERENCE, per_step)

    torch_lstm = nn.LSTM(HIDDEN, HIDDEN, LAYERS).to(device)
    stacks: dict[str, Callable[[Tensor], Tensor]] = {REFERENCE: lambda x: torch_lstm(x)[0]}
    stacks |= {family: our_recurrent_stack(family, device) for family in FAMILY_FIELDS}
    inputs = torch.randn(setup.bptt, setup.batch, HIDDEN, device=device, requires_grad=True)
    grad = torch.randn(setup.bptt, setup.batch, HIDDEN, device=device)
    recurrent_flops = {name: flops[name] - 3 * per_step * 2 * setup.vocab_size * HIDDEN for name in stacks}
    recurrent_steps = {name: recurrent_step(stack, inputs, grad) for name, stack in stacks.items()}
    recurrent = summarise(time_in_turns(recurrent_steps, rounds, device, clock), recurrent_flops, REFERENCE, per_step)
    return {"language_models": language_models, "recurrent_layers_only": recurrent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=10, help="timed steps per model, taken in turns")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="cpu: this process's CPU time, immune to other processes' load; use with --threads 1")
    parser.add_argument("--float32-matmul-precision", choices=("highest", "high"), default="high",
                        help="torch.set_float32_matmul_precision for every model: 'high' lets float32 matrix "
                             "multiplies use TF32 on GPUs, as cuDNN's LSTM does by default "
                             "(torch.backends.cudnn.allow_tf32); CPUs ignore it")
    parser.add_argument("--char-rounds", type=int, default=5, help="timed steps per model at the character level")
    parser.add_argument("--word-only", action="store_true", help="skip the character-level setup")
    parser.add_argument("--output", type=Path, help="write the JSON result here (also printed)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.float32_matmul_precision)
    heap_kept = keep_freed_memory()  # as trial processes run (tuner.trial.configure_torch), for every model
    torch.manual_seed(0)
    load_before = os.getloadavg()

    word = measure_setup(WORD, device, args.rounds, CLOCKS[args.clock])
    character = None if args.word_only else measure_setup(CHARACTER, device, args.char_rounds, CLOCKS[args.clock])

    result = {
        "benchmark": "cell_throughput",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe_machine(device, args.threads) | {"load_average_before": load_before,
                                                              "load_average_after": os.getloadavg(),
                                                              "freed_memory_kept": heap_kept},
        "setup": {
            "vocab_size": WORD.vocab_size, "embedding_size": HIDDEN, "hidden_size": HIDDEN, "layers": LAYERS,
            "batch": WORD.batch, "bptt": WORD.bptt, "mogrifier_rounds": ROUNDS, "mogrifier_rank": RANK,
            "rounds": args.rounds, "clock": args.clock, "float32_matmul_precision": args.float32_matmul_precision,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "step": "forward + cross-entropy + backward of the whole language model (no optimizer update)",
            "flops": "matrix multiplies only: 2 per weight applied per token, x3 for forward + backward",
            "efficiency_vs_reference": "achieved FLOP/s / torch.nn.LSTM's, per round, median over rounds",
        },
        "reference": REFERENCE + (" (cuDNN)" if device.type == "cuda" else " (oneDNN)"),
        "mogrifier_efficiency_ratio": word["language_models"]["mogrifier"]["efficiency_vs_reference"],
        **word,
        "fast_path_warmup": measure_warmup("mogrifier", args.device, args.threads, args.float32_matmul_precision)
        | {"compilation": WARMUP_NOTE[device.type]},
    }
    if character is not None:
        result["character_level"] = {"setup": asdict(CHARACTER) | {"rounds": args.char_rounds}, **character}
    emit_json(result, args.output)


if __name__ == "__main__":
    main()
