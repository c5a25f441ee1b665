"""The C++ kernels for CPUs (models/csrc/cpu_kernels.cpp): built on first use, cached on disk.

They serve the fast path's float32 and float64 CPU tensors: all rounds of a low-rank mogrifier step
in one call (models/mogrifier_window.py), the LSTM's element-wise update (models/lstm_update.py), and
the whole window of an LSTM, mLSTM or RLSTM layer, with or without a low-rank mogrifier, forward and backward
(models/lstm_window.py, models/rlstm_window.py).

`torch.utils.cpp_extension.load` compiles them with the machine's C++ compiler and ninja (a dependency
of this package), about 20 s on 2 cores, into `<TORCH_EXTENSIONS_DIR>/lm_tuner/<key>/`, where
TORCH_EXTENSIONS_DIR defaults to ~/.cache/torch_extensions and the key is a hash of the source, the
compile flags, the compiler's name, torch's version and Python's ABI, never of a path: checkouts with
identical sources share one build, and a changed source gets a directory of its own. The source is
copied there, so that the build directory holds everything its build read.

A finished build is marked there (built.json); later processes, every later trial of a study among
them, import it directly, with no lock and no compiler. A build is serialised by a lock that the
operating system releases when its holder dies (fcntl's flock, through filelock), so a build killed
midway (Ctrl-C, an OOM kill, a CI timeout) never blocks the next process: that one finds no mark,
clears what the killed build left (torch's own `lock` baton among it) and builds again. A process
that waits more than 5 s for another's build says once which process holds it, and gives up after
10 minutes. Where the kernels cannot be built (no compiler, say) the fast path keeps the PyTorch
operations and says why once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import sysconfig
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import filelock
import torch
from torch import Tensor

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_kernels.cpp"
EXTENSION_NAME = "lm_tuner_cpu_kernels"
FLAGS = ["-O3", "-fopenmp"]  # OpenMP: the kernel splits a step's batch rows among torch's threads
SAY_WAITING_AFTER_S = 5.0
WAIT_LIMIT_S = 600.0  # builds take ~20 s; a holder alive past this is stuck, and trials take the PyTorch path
LOCK_FILE, HOLDER_FILE, BUILT_FILE = "build.lock", "holder.json", "built.json"


def serving(*tensors: Tensor) -> ModuleType | None:
    """The compiled module where it serves all of `tensors` (float32 or float64, on the CPU), else None."""
    if all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in tensors):
        return cpu_extension()
    return None


@functools.cache
def cpu_extension() -> ModuleType | None:
    """The compiled module, or None where it cannot be built."""
    try:
        return load_or_build(kernels_directory())
    except Exception as error:  # a missing compiler, headers or ninja surface as several exception types
        warnings.warn(f"the C++ kernels for CPUs could not be built ({error}); recurrent layers on the CPU take "
                      "the slower PyTorch operations", RuntimeWarning, stacklevel=2)
        return None


def kernels_directory() -> Path:
    """Where this installation's kernels are built: TORCH_EXTENSIONS_DIR (else torch's default)/lm_tuner/<key>."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:  # importing torch's extension module costs 0.1 s, most of a later process's load
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    return build_directory(SOURCE, Path(root))


def build_directory(source: Path, root: Path) -> Path:
    """The build directory under `root` for `source`'s content with this module's flags, compiler, torch, Python."""
    key = hashlib.sha256(source.read_bytes())
    for part in (EXTENSION_NAME, *FLAGS, os.environ.get("CXX", "c++"), torch.__version__,
                 sysconfig.get_config_var("EXT_SUFFIX") or ""):  # EXT_SUFFIX names the interpreter's ABI
        key.update(b"\0" + part.encode())
    return root / "lm_tuner" / key.hexdigest()[:16]


def is_built(directory: Path) -> bool:
    """Whether `directory` holds a finished build (a later load imports it, with no compiler)."""
    return (directory / BUILT_FILE).is_file()


def load_or_build(directory: Path) -> ModuleType:
    """The kernels built in `directory`, building them first where no finished build is there."""
    if (module := _import_built(directory)) is not None:
        return module
    directory.mkdir(parents=True, exist_ok=True)
    with build_lock(directory):
        return _import_built(directory) or _build(directory)  # another process may have built it meanwhile


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Held while building in `directory`, with who holds it on record; released by the OS when its holder dies."""
    lock = filelock.FileLock(directory / LOCK_FILE)
    try:
        lock.acquire(timeout=SAY_WAITING_AFTER_S)
    except filelock.Timeout:
        warnings.warn(f"waiting for the C++ kernels for CPUs: {_holder(directory)} is building them in {directory}; "
                      f"waiting up to {WAIT_LIMIT_S:.0f} s more", RuntimeWarning, stacklevel=3)
        try:
            lock.acquire(timeout=WAIT_LIMIT_S)
        except filelock.Timeout:
            raise TimeoutError(f"{_holder(directory)} still held the lock on building the C++ kernels in "
                               f"{directory} after {SAY_WAITING_AFTER_S + WAIT_LIMIT_S:.0f} s; end it if it is "
                               "stuck") from None
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        (directory / HOLDER_FILE).write_text(json.dumps(record))
        yield
    finally:
        lock.release()


def _holder(directory: Path) -> str:
    try:
        record = json.loads((directory / HOLDER_FILE).read_text())
    except (OSError, ValueError):
        return "an unknown process"
    started = time.strftime("%H:%M:%S", time.localtime(record["since"]))
    return f"pid {record['pid']} on {record['host']} (since {started})"


def _import_built(directory: Path) -> ModuleType | None:
    try:
        built = json.loads((directory / BUILT_FILE).read_text())
    except FileNotFoundError:
        return None
    spec = importlib.util.spec_from_file_location(built["module"], directory / built["library"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(directory: Path) -> ModuleType:
    """Under the build lock: whatever is here besides the lock is an unfinished build's, torch's baton among it."""
    from torch.utils.cpp_extension import load

    for entry in directory.iterdir():
        if entry.name in (LOCK_FILE, HOLDER_FILE):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    source = directory / SOURCE.name
    shutil.copyfile(SOURCE, source)
    _put_ninja_on_path()
    module = load(name=EXTENSION_NAME, sources=[str(source)], extra_cflags=FLAGS, extra_ldflags=FLAGS,
                  build_directory=str(directory))
    # torch names a module built again in one process (another directory) `<name>_v1`, so the mark says which
    marker = directory / f"{BUILT_FILE}.{os.getpid()}"
    marker.write_text(json.dumps({"module": module.__name__, "library": Path(module.__file__).name}))
    marker.replace(directory / BUILT_FILE)
    return module


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the ninja package's binary is not on it when a venv is not activated."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
