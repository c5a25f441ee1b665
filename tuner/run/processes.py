"""Stopping cleanly: SIGINT and SIGTERM become one orderly stop, and nothing this process started outlives it.

A command that runs trials (`tuner launch`, `resume`, `worker`, `serve`) starts other processes: Ray's
GCS server, raylet and agents, the trial workers, the REST server's queue worker. Its first SIGINT or
SIGTERM raises KeyboardInterrupt in the main thread, so the controller marks running trials interrupted
(they run again on resume) and puts its study back in order; later signals are ignored while it does.
Then `stop_children` ends whatever is left, including processes that detached from their parent:
the command adopts them as a child subreaper (Linux), so they stay its descendants.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import psutil

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_stop_signal: list[int] = []  # the signal that asked this process to stop, once one has
_hooks_before: list = []  # the sys.unraisablehook that _deliver_dropped_stop hands other exceptions on to
DATABASE_MODULES = ("sqlalchemy.", "sqlite3", "psycopg", "optuna.storages")
DEFERRED_STOP_SECONDS = 0.05  # how soon a stop that arrived in a database call, or was dropped, is delivered again


def stop_on_signals() -> None:
    """The first SIGINT or SIGTERM raises KeyboardInterrupt, so every layer that tidies up on Ctrl-C does; later
    ones are ignored, so that tidying up is not itself interrupted. Which signal it was is `stop_signal()`:
    libraries re-raise a KeyboardInterrupt of their own (Ray does, from a wait), so the exception cannot carry
    it. Set explicitly: a command started in the background of a script inherits SIGINT ignored.

    A signal that arrives while the main thread is inside the database driver or Optuna's storage is delivered
    once that call has returned: an exception raised half-way through a commit leaves the session unusable, and
    the tidying up that follows needs it to mark the running trials interrupted. One that arrives while the main
    thread runs a finalizer or a weakref callback (the garbage collector calls them between any two lines), where
    Python prints an exception and drops it, is delivered again once that code has returned: otherwise the stop
    would be lost, and the command would run on with the signals ignored."""
    for number in STOP_SIGNALS:
        signal.signal(number, _request_stop)
    if sys.unraisablehook is not _deliver_dropped_stop:
        _hooks_before.append(sys.unraisablehook)
        sys.unraisablehook = _deliver_dropped_stop


def _request_stop(signal_number: int, frame: FrameType | None) -> None:
    if not _stop_signal:
        _stop_signal.append(signal_number)
    if in_database_call(frame):
        _deliver_later(signal_number)
        return
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(_stop_signal[0]).name)


def _deliver_dropped_stop(unraisable: sys.UnraisableHookArgs) -> None:
    """sys.unraisablehook: a stop's KeyboardInterrupt that Python dropped (in the main thread, where the stop was
    raised and signal handlers can be set) is delivered again; anything else goes on to the hook there before."""
    if (isinstance(unraisable.exc_value, KeyboardInterrupt) and _stop_signal
            and threading.current_thread() is threading.main_thread()):
        for number in STOP_SIGNALS:
            signal.signal(number, _request_stop)
        _deliver_later(_stop_signal[0])
        return
    _hooks_before[-1](unraisable)


def _deliver_later(signal_number: int) -> None:
    threading.Timer(DEFERRED_STOP_SECONDS, os.kill, (os.getpid(), signal_number)).start()


def in_database_call(frame: FrameType | None) -> bool:
    """Whether `frame` or one of its callers runs code of the database layers (SQLAlchemy, the drivers, Optuna's
    storage), where an exception would leave a connection or a session half-way through a transaction."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(DATABASE_MODULES):
            return True
        frame = frame.f_back
    return False


def stop_signal() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _stop_signal[0] if _stop_signal else None


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Run code that installs handlers of its own for SIGINT and SIGTERM (ray.init does: its SIGTERM handler
    exits at once, and its core worker's aborts the process), then put the process's handlers back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in kept.items():
            if handler is not None:
                signal.signal(number, handler)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Run code during which a stop must wait (ray.shutdown swaps SIGTERM's handler while it runs): SIGINT and SIGTERM
    are blocked, the process's handlers put back afterwards, then the signals unblocked, so that one sent meanwhile
    is handled as any other."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with signal_handlers_kept():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def die_with_parent(parent: int) -> None:
    """Receive SIGTERM when process `parent` exits (Linux; a no-op elsewhere): for a child that runs in a process
    group of its own, which no signal from the terminal reaches, so that it never outlives the command it serves."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it exited before it could be watched
        os.kill(os.getpid(), signal.SIGTERM)


def adopt_orphans() -> None:
    """Become a child subreaper: a descendant whose parent exits is re-parented to this process instead of
    init, so `stop_children` still finds it (Ray's helpers detach this way). A no-op outside Linux."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def stop_children(grace_seconds: float = 5.0) -> list[int]:
    """Ask every descendant to terminate, kill those still alive after `grace_seconds`, and reap them all
    (again for any that a dying one left behind). Returns the process ids that had to be killed."""
    killed: list[int] = []
    for _ in range(3):
        descendants = psutil.Process().children(recursive=True)
        if not descendants:
            break
        for process in descendants:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(descendants, timeout=grace_seconds)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=grace_seconds)
        killed += [process.pid for process in alive]
    return killed
