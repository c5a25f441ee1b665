"""Objects that live as long as the process, kept out of Python's garbage collections."""

from __future__ import annotations

import atexit
import gc
import sys
from functools import cache


def freeze_loaded_objects() -> None:
    """Move every object made so far (torch, Ray, pandas...: some 400,000) to a generation the collector never scans:
    each full collection would otherwise walk them all with the GIL held (~0.2 s, every request of the API waiting),
    as would finalization (1-3 s on 2 cores). Where Triton is loaded by the process's end (torch._dynamo loads it),
    they go back to the collector then: Triton's bindings report every object still alive at exit as a leak,
    hundreds of lines on stderr."""
    gc.freeze()
    _unfreeze_at_exit_where_triton_is_loaded()


@cache
def _unfreeze_at_exit_where_triton_is_loaded() -> None:
    atexit.register(lambda: "triton" in sys.modules and gc.unfreeze())
