"""Keep this process's freed memory for reuse instead of handing it back to the kernel after every step.

A training step on the CPU frees large buffers (weight gradients, activations, logits) and allocates
them again in the next step. glibc's malloc serves a block above its mmap threshold (dynamic, at most
32 MiB) with a fresh mapping and gives the free top of its heap back to the kernel beyond a trim
threshold, so each step faults its memory back in page by page, zero-filled by the kernel:
`benchmarks/heap_reuse.py` measures how often and what it costs. Raising both thresholds keeps that
memory in the heap, where the next step finds it. The process keeps up to its peak use, which it
reaches again in every step anyway.

Other C libraries (musl, macOS) keep their own policies; there this does nothing.
"""

from __future__ import annotations

import ctypes
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
RETAINED_BYTES = 1 << 30
"""Blocks up to this size come from the heap, and up to this much free memory stays at its top."""


def keep_freed_memory() -> bool:
    """Tells glibc's malloc to reuse freed blocks rather than unmap and trim them (process-wide).

    Returns whether it took effect: False where the C library is not glibc.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, RETAINED_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES))
