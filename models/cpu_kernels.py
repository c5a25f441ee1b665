"""The C++ kernels for CPUs (models/csrc/cpu_kernels.cpp): built on first use, cached on disk.

They serve the fast path's float32 and float64 CPU tensors: all rounds of a low-rank mogrifier step
in one call (models/mogrifier_window.py), and the LSTM's element-wise update (models/cells.py).

`torch.utils.cpp_extension.load` compiles it with the machine's C++ compiler and ninja (a dependency
of this package) into TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions: about 20 s on 2
cores, once per machine and source version. Later processes, every later trial of a study among
them, load that build in milliseconds, and concurrent first uses wait on one build behind a file
lock. Where it cannot be built (no compiler, say) the fast path keeps the PyTorch operations and says
why once.
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_kernels.cpp"
EXTENSION_NAME = "lm_tuner_cpu_kernels"
FLAGS = ["-O3", "-fopenmp"]  # OpenMP: the kernel splits a step's batch rows among torch's threads


def serving(*tensors: Tensor) -> ModuleType | None:
    """The compiled module where it serves all of `tensors` (float32 or float64, on the CPU), else None."""
    if all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in tensors):
        return cpu_extension()
    return None


@functools.cache
def cpu_extension() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    try:
        return load(name=EXTENSION_NAME, sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=FLAGS)
    except Exception as error:  # a missing compiler, headers or ninja surface as several exception types
        warnings.warn(f"the C++ kernels for CPUs could not be built ({error}); recurrent layers on the CPU take "
                      "the slower PyTorch operations", RuntimeWarning, stacklevel=2)
        return None


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the ninja package's binary is not on it when a venv is not activated."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
