"""The C++ mogrifier kernel for CPUs (models/csrc/mogrifier_cpu.cpp): built on first use, cached on disk.

`torch.utils.cpp_extension.load` compiles it with the machine's C++ compiler and ninja (a dependency
of this package) into TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions: about 20 s on 2
cores, once per machine and source version. Later processes, every later trial of a study among
them, load that build in milliseconds, and concurrent first uses wait on one build behind a file
lock. Where it cannot be built (no compiler, say) the fast path keeps the per-step PyTorch mogrifier
and says why once.
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parent / "csrc" / "mogrifier_cpu.cpp"
EXTENSION_NAME = "lm_tuner_mogrifier_cpu"
FLAGS = ["-O3", "-fopenmp"]  # OpenMP: the kernel splits a step's batch rows among torch's threads


@functools.cache
def mogrifier_extension() -> ModuleType | None:
    """The compiled module (with its MogrifierWindow class), or None where it cannot be built."""
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    try:
        return load(name=EXTENSION_NAME, sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=FLAGS)
    except Exception as error:  # a missing compiler, headers or ninja surface as several exception types
        warnings.warn(f"the C++ mogrifier kernel for CPUs could not be built ({error}); mogrifier layers on the "
                      "CPU take the slower per-step PyTorch path", RuntimeWarning, stacklevel=2)
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
