"""Achieved FLOP/s by machine kind and family, as benchmarks/cell_throughput.py measured them (the committed results,
derived into throughput.json beside this module by benchmarks/throughput_table.py): what a study's FLOP count is
divided by where the probe cannot run. A machine without a measurement of its own takes a stated default."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from statistics import fmean
from typing import Any, Literal

from lm_tuner.models import family as family_of

TABLE = "throughput.json"
DEFAULT_GPU_FILE = "cell_throughput_gpu.json"  # NVIDIA H100 80GB HBM3, the GPU most studies here ran on
Device = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Throughput:
    """Each family's FLOP/s on one measured machine kind, and what was measured, said in words."""

    flops_per_second: dict[str, float]
    machine: str  # the machine measured, in a few words
    measured: str  # what was measured, and where it is recorded
    hidden_size: int  # of the models measured: smaller ones reach fewer FLOP/s
    notes: tuple[str, ...] = ()


@cache
def throughput_table() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(TABLE).read_text())


def measured_throughput(families: list[str], *, device: Device, threads: int, cpu_kind: str | None,
                        gpu_name: str | None, character_level: bool) -> Throughput:
    """The rates of `families` on the kind measured that fits: this GPU's (`gpu_name`), else the default GPU; this
    CPU's (`cpu_kind`: family/model/stepping) at the most threads measured up to `threads`, else the slowest CPU
    measured (the estimate then errs long). Character-level studies take the character-level measurement where
    the kind has one."""
    kinds = [kind for kind in throughput_table()["kinds"] if kind["device"] == device]
    kind, why = _gpu_kind(kinds, gpu_name) if device == "gpu" else _cpu_kind(kinds, threads, cpu_kind)
    level = "character" if character_level and "character" in kind else "word"
    notes = [why] if why else []
    if character_level and level == "word":
        notes.append("this kind was measured at the word level only")
    rates = kind[level]["flops_per_second"]
    chosen = {}
    for name in families:
        measured_as = _measured_name(name, rates)
        if measured_as is None:
            chosen[name] = min(rates.values())
            notes.append(f"{name} was not measured: the slowest measured family's rate")
        else:
            chosen[name] = rates[measured_as]
            if measured_as != name:
                notes.append(f"{name} at {measured_as}'s rate (the same cell)")
    machine = kind["gpu"] if device == "gpu" else f"{kind['cpu']} {kind['cpu_family_model_stepping']}"
    threads_said = "" if device == "gpu" else f", {kind['threads']} thread{'s' if kind['threads'] > 1 else ''}"
    measured = (f"benchmarks/cell_throughput.py on {machine}{threads_said}, {level} level, E = H = "
                f"{kind['hidden_size']} ({kind['file']})")
    return Throughput(chosen, machine, measured, kind["hidden_size"], tuple(notes))


def _gpu_kind(kinds: list[dict[str, Any]], gpu_name: str | None) -> tuple[dict[str, Any], str | None]:
    for kind in kinds:
        if gpu_name is not None and kind["gpu"] == gpu_name:
            return kind, None
    default = next(kind for kind in kinds if kind["file"] == DEFAULT_GPU_FILE)
    why = "this machine has no GPU" if gpu_name is None else f"{gpu_name} was not measured"
    return default, f"{why}: the default GPU, {default['gpu']}"


def _cpu_kind(kinds: list[dict[str, Any]], threads: int, cpu_kind: str | None) -> tuple[dict[str, Any], str | None]:
    counts = sorted({kind["threads"] for kind in kinds})
    measured_threads = max([count for count in counts if count <= threads] or counts[:1])
    at_threads = [kind for kind in kinds if kind["threads"] == measured_threads]
    why = None if measured_threads == threads else \
        f"measured with {measured_threads} thread(s), the trial's {threads:g} may run faster"
    for kind in at_threads:
        if kind["cpu_family_model_stepping"] == cpu_kind:
            return kind, why
    model = _family_and_model(cpu_kind)
    for kind in at_threads:
        if model is not None and _family_and_model(kind["cpu_family_model_stepping"]) == model:
            another = f"this CPU ({cpu_kind}) was not measured: another stepping of its model, " \
                      f"{kind['cpu_family_model_stepping']}"
            return kind, "; ".join(filter(None, [another, why]))
    slowest = min(at_threads, key=lambda kind: fmean(kind["word"]["flops_per_second"].values()))
    unmeasured = f"this CPU ({cpu_kind or 'unknown kind'}) was not measured: the slowest CPU measured, so the " \
                 f"estimate errs long"
    return slowest, "; ".join(filter(None, [unmeasured, why]))


def _family_and_model(family_model_stepping: str | None) -> str | None:
    """The processor model of a family/model/stepping ("6/167" of "6/167/1"): its steppings revise one design."""
    return None if family_model_stepping is None else family_model_stepping.rsplit("/", 1)[0]


def _measured_name(name: str, rates: dict[str, float]) -> str | None:
    """The family's own measurement, else that of a measured family with the same cell, with a mogrifier or not."""
    if name in rates:
        return name
    wanted = family_of(name)
    return next((measured for measured in rates if family_of(measured).cell == wanted.cell
                 and family_of(measured).mogrifier == wanted.mogrifier), None)
