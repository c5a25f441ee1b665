"""The malloc policy of trial and evaluation processes: freed memory is reused, not faulted back in."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from lm_tuner.trainers.heap import RETAINED_BYTES, keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]
FAULTS_PER_ALLOCATION = """
import json, resource, sys, torch
from lm_tuner.trainers.heap import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
counts = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(10_000_000)  # 40 MB, allocated and freed as a training step's gradients are
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(counts))
"""


def faults_per_allocation(policy: str) -> list[int]:
    result = subprocess.run([sys.executable, "-c", FAULTS_PER_ALLOCATION, policy], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's malloc's")
def test_kept_memory_is_reused_instead_of_faulted_in_again() -> None:
    pages = 40_000_000 // 4096
    default, kept = faults_per_allocation("default")[-10:], faults_per_allocation("kept")[-10:]
    assert min(default) > pages // 2  # every allocation maps fresh pages
    assert kept == [0] * 10  # once the heap has grown, none


def test_blocks_up_to_a_gibibyte_stay_in_the_heap() -> None:
    assert RETAINED_BYTES == 1 << 30
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
