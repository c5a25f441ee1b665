"""Objects that live as long as the process, kept out of Python's garbage collections."""

from __future__ import annotations

import gc
import sys


def freeze_loaded_objects() -> None:
    """Move every object made so far (torch, Ray, pandas...: some 400,000) to a generation the collector never scans:
    each full collection would otherwise walk them all with the GIL held (~0.2 s), as would finalization (1-3 s on 2
    cores). Not where Triton is loaded (torch._dynamo loads it): its bindings report every object still alive at the
    process's end as a leak, hundreds of lines on stderr."""
    if "triton" not in sys.modules:
        gc.freeze()
