"""SIGTERM and SIGINT stop `tuner serve`, `tuner worker` and `tuner launch` cleanly: running trials are marked
interrupted (they run again on resume), no process they started survives, and the exit status is the documented
one. Real processes, counted."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.conftest import TINY_SPEC
from tests.test_cli import _answers, _wait_for
from tests.test_cli import environment as _environment
from tests.test_fault_tolerance import free_port

pytestmark = pytest.mark.slow

SLOW = {**TINY_SPEC, "name": "slow", "families": ["lstm"], "fixed": {"num_layers": 1},
        "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
        "training": {**TINY_SPEC["training"], "turns": 4, "steps_per_turn": 400},
        "tuning": {"sampler": "random", "trials": 4, "concurrency": 2}}
STOP_SECONDS = 30  # the bound on stopping every child


def test_stop_children_ends_a_tree_and_the_orphans_it_adopted(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "from lm_tuner.tuner.run.processes import adopt_orphans, stop_children\n"
        "adopt_orphans()\n"
        # the subshell exits at once: its `sleep` detaches as Ray's helpers do, and is re-parented to this process
        "child = subprocess.Popen(['sh', '-c', '(sleep 300 &); exec sleep 300'])\n"
        "time.sleep(1)\n"
        "print(' '.join(str(p.pid) for p in __import__('psutil').Process().children(recursive=True)), flush=True)\n"
        "print(stop_children(grace_seconds=2), flush=True)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    started = [int(pid) for pid in run.stdout.splitlines()[0].split()]
    assert len(started) == 2  # the sleep it started and the orphan it adopted
    assert not [pid for pid in started if _alive(pid)]


def test_a_signal_during_a_commit_stops_after_it_and_the_session_still_works(tmp_path):
    # The signal arrives while SQLAlchemy executes an INSERT (as a stop can land inside Optuna's commit); raised
    # there, the KeyboardInterrupt would tear the transaction and leave the session unusable for tidying up.
    script = (
        "import os, signal, time\n"
        "from sqlalchemy import create_engine, event, text\n"
        "from lm_tuner.tuner.run.processes import stop_on_signals\n"
        f"engine = create_engine('sqlite:///{tmp_path / 'stop.db'}')\n"
        "with engine.begin() as c: c.execute(text('CREATE TABLE t (x INTEGER)'))\n"
        "event.listen(engine, 'before_cursor_execute', lambda *a: os.kill(os.getpid(), signal.SIGTERM))\n"
        "stop_on_signals()\n"
        "try:\n"
        "    with engine.begin() as c: c.execute(text('INSERT INTO t VALUES (1)'))\n"
        "    print('committed', flush=True)\n"
        "    time.sleep(5)\n"
        "except KeyboardInterrupt as stop:\n"
        "    print('stopped', stop, flush=True)\n"
        "engine.dispose()\n"
        "with create_engine(engine.url).connect() as c:\n"
        "    print('rows', c.execute(text('SELECT count(*) FROM t')).scalar())\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["committed", "stopped SIGTERM", "rows 1"]


def test_a_signal_during_a_weakref_callback_still_stops(tmp_path):
    # Python prints and drops an exception raised in a finalizer or a weakref callback, which the garbage collector
    # runs between any two lines: a stop raised there was lost, and `tuner launch` ran its study to the end with the
    # signals ignored (seen once in the test below).
    script = (
        "import os, signal, time, weakref\n"
        "from lm_tuner.tuner.run.processes import stop_on_signals\n"
        "stop_on_signals()\n"
        "class Thing: pass\n"
        "def collected(_):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    for _ in range(100_000): pass  # the handler runs in here\n"
        "thing = Thing()\n"
        "reference = weakref.ref(thing, collected)\n"
        "try:\n"
        "    del thing\n"
        "    time.sleep(5)\n"
        "    print('ran on', flush=True)\n"
        "except KeyboardInterrupt as stop:\n"
        "    print('stopped', stop, flush=True)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout) == (0, "stopped SIGINT\n"), run.stderr
    assert "Exception ignored" not in run.stderr


def test_sigterm_stops_serve_its_worker_and_every_trial(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                              env=_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        _wait_for(lambda: _answers(client), 90, "the server did not start")
        assert client.post("/studies", content=yaml.safe_dump({**SLOW, "name": "served"})).status_code == 202
    database = tmp_path / "home" / "tuner.db"
    _wait_for(lambda: _running_trials(database) == 2, 180, "the worker never ran two trials")
    children = psutil.Process(server.pid).children(recursive=True)
    assert len(children) >= 4  # the worker, Ray's processes and the two trials

    seconds = _stop(server, signal.SIGTERM)
    output = server.stdout.read()
    assert server.returncode == 0, output[-3000:]
    assert seconds < STOP_SECONDS
    assert _survivors(children) == []
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT status FROM lmt_studies").fetchall() == [("queued",)]  # a worker continues
        states = connection.execute("SELECT state, interrupted FROM lmt_trials").fetchall()
    assert states == [("FAIL", 1), ("FAIL", 1)]  # interrupted: they do not count, and run again
    assert "study served put back in the queue" in output


def test_ctrl_c_while_the_worker_starts_stops_serve_without_a_traceback(tmp_path):
    """A terminal's Ctrl-C goes to the whole foreground process group: a worker still importing printed a
    KeyboardInterrupt traceback of 50 lines; it now runs in a group of its own, and `serve` stops it."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                              env=_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)  # its own group, as a shell's foreground job
    lines = []
    for line in server.stdout:
        lines.append(line)
        if "dashboard:" in line:  # printed once the worker has been started
            break
    children = psutil.Process(server.pid).children(recursive=True)
    os.killpg(server.pid, signal.SIGINT)
    output = "".join(lines) + server.stdout.read()
    assert server.wait(timeout=STOP_SECONDS) == 0, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert children and _survivors(children) == []


def test_the_worker_of_a_killed_serve_stops_too(tmp_path):
    """The worker gets no signal from the terminal (a process group of its own): it stops when `serve` is gone."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                              env=_environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        _wait_for(lambda: _answers(client), 90, "the server did not start")
    (worker,) = psutil.Process(server.pid).children()
    _wait_for(lambda: "worker" in " ".join(worker.cmdline()) and worker.status() != psutil.STATUS_ZOMBIE, 30,
              "no worker")
    time.sleep(3)  # past its imports: it stops cleanly, not by SIGTERM's default action
    server.kill()
    server.wait()
    _wait_for(lambda: not _alive(worker.pid), STOP_SECONDS, "the worker outlived `serve`")


def test_serve_refuses_a_port_in_use_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                             env=_environment(tmp_path), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.strip() == (f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); "
                                  f"stop what uses it or choose another port")
    assert "dashboard:" not in run.stdout


@pytest.mark.parametrize("stop, exit_status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_launch_leaves_no_process_and_resumable_trials(tmp_path, stop, exit_status):
    space = tmp_path / "slow.yaml"
    space.write_text(yaml.safe_dump(SLOW))
    launch = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "launch", "--space", str(space)], cwd=tmp_path,
                              env=_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    database = tmp_path / "home" / "tuner.db"
    _wait_for(lambda: _running_trials(database) == 2, 180, "no two trials ran")
    children = psutil.Process(launch.pid).children(recursive=True)

    seconds = _stop(launch, stop)
    error = launch.stderr.read()
    assert launch.returncode == exit_status, error[-3000:]
    assert seconds < STOP_SECONDS and _survivors(children) == []
    assert "Traceback" not in error
    assert error.splitlines()[-1].startswith(f"stopped by {stop.name}: ") and "tuner resume slow" in error
    with sqlite3.connect(database) as connection:
        (status, reason), = connection.execute("SELECT status, error FROM lmt_studies").fetchall()
        states = connection.execute("SELECT state, interrupted FROM lmt_trials").fetchall()
    assert status == "failed" and reason.startswith("interrupted")
    assert states == [("FAIL", 1), ("FAIL", 1)]


def test_a_launch_in_a_scripts_background_stops_on_a_sigint_sent_while_it_loads(tmp_path):
    """A script's background job inherits SIGINT ignored: one sent before the command set its handlers (while it
    imported, 1-3 s) was lost, and the launch ran its whole study. The command takes SIGINT as it starts; stopped
    while loading, it exits quietly with 130, before anything is written."""
    space = tmp_path / "slow.yaml"
    space.write_text(yaml.safe_dump(SLOW))
    launch = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "launch", "--space", str(space)], cwd=tmp_path,
                              env=_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not _takes_sigint(launch.pid):  # polled closely: the imports after that last a second or more
        assert time.monotonic() < deadline, "SIGINT stayed ignored"
        time.sleep(0.002)
    seconds = _stop(launch, signal.SIGINT)
    output, error = launch.communicate()
    assert (launch.returncode, output, error) == (130, "", "")
    assert seconds < STOP_SECONDS and not (tmp_path / "home").exists()


def _takes_sigint(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGINT (Linux: /proc/PID/status)."""
    masks = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                 if line.startswith(("SigIgn", "SigCgt")))
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(masks["SigCgt"], 16) & bit) and not int(masks["SigIgn"], 16) & bit


def _stop(process: subprocess.Popen, number: int) -> float:
    started = time.monotonic()
    process.send_signal(number)
    process.wait(timeout=120)
    return time.monotonic() - started


def _survivors(processes: list[psutil.Process]) -> list[tuple[int, str]]:
    time.sleep(1)
    return [(p.pid, p.name()) for p in processes if _alive(p.pid) and p.is_running()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _running_trials(database: Path) -> int:
    try:  # read-only, so the poll never creates the database the command is creating
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
            return connection.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
