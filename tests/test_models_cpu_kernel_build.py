"""Building the C++ kernels for CPUs (models/cpu_kernels.py): killed builds, stale locks, waiting, shared builds.

Every process here builds into a TORCH_EXTENSIONS_DIR of its own under tmp_path, so the user's cache and this
process's loaded kernels stay out of it. "No compiler" is CXX naming a file that does not exist: the build then
fails in a second, so the tests that need no real build stay fast.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from lm_tuner.models import cpu_kernels

ROOT = Path(__file__).resolve().parent.parent
NO_COMPILER = {"CXX": "/nonexistent/c++"}
RECOVERY_LIMIT_S = 240  # a fresh build takes 20-27 s on 2 idle cores; this machine is shared
LOAD = (
    "import json, time\n"
    "from lm_tuner.models import cpu_kernels\n"
    "started = time.perf_counter()\n"
    "module = cpu_kernels.cpu_extension()\n"
    "print(json.dumps({'seconds': time.perf_counter() - started, 'kernels': hasattr(module, 'lstm_update'),\n"
    "                  'file': getattr(module, '__file__', None), 'source': str(cpu_kernels.SOURCE)}))\n"
)
HOLD_THE_BUILD_LOCK = (
    "import sys\n"
    "from lm_tuner.models import cpu_kernels\n"
    "directory = cpu_kernels.kernels_directory()\n"
    "directory.mkdir(parents=True)\n"
    "with cpu_kernels.build_lock(directory):\n"
    "    print(directory, flush=True)\n"
    "    sys.stdin.read()\n"
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(ROOT),
            "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "HOME": str(tmp_path), **extra}


def _load(env: dict[str, str], timeout: float, checkout: Path = ROOT) -> tuple[dict, str]:
    """What a new process's cpu_extension() gave (kernels or not, how long it took, its file, the source it was built
    from), and its stderr."""
    output = subprocess.run([sys.executable, "-c", LOAD], cwd=checkout, env={**env, "PYTHONPATH": str(checkout)},
                            capture_output=True, text=True, timeout=timeout)
    assert output.returncode == 0, output.stderr
    return json.loads(output.stdout.strip().splitlines()[-1]), output.stderr


def _wait_for(condition: Callable[[], bool], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def _compiling(builder: subprocess.Popen) -> bool:
    assert builder.poll() is None, "the build ended before its compiler was seen"
    with suppress(psutil.NoSuchProcess):
        return any(child.name() == "cc1plus" for child in psutil.Process(builder.pid).children(recursive=True))
    return False


def _kill_with_its_compiler(builder: subprocess.Popen) -> None:
    """SIGKILL the builder's process group, and the compilers that ninja starts in process groups of their own."""
    descendants = psutil.Process(builder.pid).children(recursive=True)
    os.killpg(builder.pid, signal.SIGKILL)
    for process in descendants:
        with suppress(psutil.NoSuchProcess):
            process.kill()
    builder.wait(timeout=60)


def test_identical_sources_share_a_build_directory_and_a_changed_one_gets_its_own(tmp_path, monkeypatch):
    root = tmp_path / "torch_extensions"
    checkouts = [tmp_path / "checkout" / "cpu_kernels.cpp", tmp_path / "elsewhere" / "kernels.cpp"]
    for source in checkouts:
        source.parent.mkdir()
        shutil.copyfile(cpu_kernels.SOURCE, source)
    shared = cpu_kernels.build_directory(checkouts[0], root)
    assert shared.parent == root / "lm_tuner" and cpu_kernels.build_directory(checkouts[1], root) == shared

    changed = tmp_path / "changed.cpp"
    changed.write_bytes(cpu_kernels.SOURCE.read_bytes() + b"\n// changed\n")
    assert cpu_kernels.build_directory(changed, root) != shared
    monkeypatch.setenv("CXX", "clang++")
    assert cpu_kernels.build_directory(checkouts[0], root) != shared
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(cpu_kernels, "FLAGS", [*cpu_kernels.FLAGS, "-march=native"])
    assert cpu_kernels.build_directory(checkouts[0], root) != shared


def test_stale_build_locks_do_not_hang_a_new_process_and_no_compiler_means_one_warning(tmp_path, monkeypatch):
    """torch's `lock` baton of a killed build, in the build directory and where earlier versions built."""
    env = _env(tmp_path, **NO_COMPILER)
    for name in ("TORCH_EXTENSIONS_DIR", "CXX"):
        monkeypatch.setenv(name, env[name])
    for baton in (cpu_kernels.kernels_directory() / "lock",
                  Path(env["TORCH_EXTENSIONS_DIR"]) / cpu_kernels.EXTENSION_NAME / "lock"):
        baton.parent.mkdir(parents=True)
        baton.touch()
    result, stderr = _load(env, timeout=120)
    assert not result["kernels"]
    assert stderr.count("RuntimeWarning: the C++ kernels for CPUs could not be built") == 1, stderr


def test_a_process_waiting_on_another_build_says_once_who_holds_it(tmp_path):
    env = _env(tmp_path, **NO_COMPILER)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_BUILD_LOCK], cwd=ROOT, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    waiter_stderr, waiter = tmp_path / "waiter.stderr", None
    try:
        directory = holder.stdout.readline().strip()
        assert directory, "the holder did not take the lock"
        with waiter_stderr.open("w") as stderr:
            started = time.monotonic()
            waiter = subprocess.Popen([sys.executable, "-c", LOAD], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=stderr)
        _wait_for(lambda: "waiting for the C++ kernels" in waiter_stderr.read_text(), 120, "the waiter said nothing")
        said_after = time.monotonic() - started
        time.sleep(3)  # still waiting: it must not say so again
        holder.stdin.close()
        holder.wait(timeout=60)
        stdout, _ = waiter.communicate(timeout=120)
    finally:
        for process in (holder, waiter):
            if process is not None and process.poll() is None:
                process.kill()
    said = [line for line in waiter_stderr.read_text().splitlines() if "waiting for the C++ kernels" in line]
    assert len(said) == 1, said
    assert f"pid {holder.pid} on " in said[0] and directory in said[0]
    assert said_after >= cpu_kernels.SAY_WAITING_AFTER_S
    assert waiter.returncode == 0 and not json.loads(stdout.strip().splitlines()[-1])["kernels"]  # no compiler


@pytest.mark.slow
def test_a_build_killed_midway_does_not_block_the_next_process_whose_build_later_ones_load(tmp_path):
    env = _env(tmp_path)
    builder = subprocess.Popen([sys.executable, "-c", LOAD], cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _compiling(builder), 120, "the build's compiler never started")
    finally:
        _kill_with_its_compiler(builder)
    assert list(Path(env["TORCH_EXTENSIONS_DIR"]).rglob("lock")), "the killed build left no torch baton behind"

    started = time.monotonic()
    built, stderr = _load(env, timeout=RECOVERY_LIMIT_S)
    assert built["kernels"], stderr
    print(f"kernels after the killed build: {time.monotonic() - started:.1f} s")  # 24 s here, on 2 loaded cores

    # A later process loads that build instead of compiling, as a study's later trials do, even from another checkout
    # of the same source (its models come first on the path, as the namespace package lm_tuner.models).
    other_checkout = tmp_path / "other_checkout"
    shutil.copytree(ROOT / "models", other_checkout / "lm_tuner" / "models",
                    ignore=shutil.ignore_patterns("__pycache__"))
    loaded, stderr = _load(env, timeout=RECOVERY_LIMIT_S, checkout=other_checkout)
    assert Path(loaded["source"]).is_relative_to(other_checkout), stderr
    assert Path(built["file"]).is_relative_to(env["TORCH_EXTENSIONS_DIR"]) and loaded["file"] == built["file"]
    assert loaded["seconds"] < built["seconds"] / 3, (built, loaded)  # here 0.002 s against 22 s


def test_kernels_build_says_what_it_built_where_and_what_for():
    from typer.testing import CliRunner

    from lm_tuner.tuner.cli.app import app

    first = CliRunner().invoke(app, ["kernels", "build"])  # built by `make setup` here, else built now
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, ["kernels", "build"])
    assert again.exit_code == 0, again.output
    said, where, what_for = again.stdout.splitlines()
    assert said == "C++ kernels for recurrent layers on CPUs: already built"
    assert Path(where).parent == cpu_kernels.kernels_directory() and Path(where).is_file()
    assert what_for.startswith("What they are for: trials on CPUs compute LSTM, mLSTM and RLSTM layers")
    assert re.fullmatch(r"C\+\+ kernels for recurrent layers on CPUs: (already built|built in \d+\.\d s)",
                        first.stdout.splitlines()[0])
