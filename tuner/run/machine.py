"""This machine, as cost estimates and the probe see it: its usable CPUs, its GPUs and the CPU's kind."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lm_tuner.tuner.spec.estimate import Machine


def this_machine() -> Machine:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gpus = torch.cuda.device_count()
    return Machine(cpus=cpus, gpus=gpus, cpu_kind=cpu_kind(), gpu_name=torch.cuda.get_device_name(0) if gpus else None)


def cpu_kind(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's family/model/stepping, as benchmarks/cell_throughput.py records it; None where the system does not
    tell (no /proc/cpuinfo)."""
    try:
        first = cpuinfo.read_text().split("\n\n")[0]
    except OSError:
        return None
    fields = dict(line.partition(":")[::2] for line in first.splitlines())
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    parts = [fields.get(key) for key in ("cpu family", "model", "stepping")]
    return "/".join(parts) if all(parts) else None
