"""A SQLite database file deleted or replaced under a running process (a server, a controller) is noticed before
the process's next transaction, instead of writes going on into the deleted file, where they are lost, or into a
file of which this process knows nothing.

SQLite writes through the file descriptor a connection opened: a file deleted since keeps taking writes, which no
other process will ever read, and a file put in its place is another database. The file's identity (device and
inode) when the engine first opened it is compared with the path's before every new connection and every
transaction.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, event


class DatabaseReplaced(RuntimeError):
    """The SQLite file this process opened is no longer at its path (deleted), or another file is (replaced):
    nothing more is read from or written to it; the process must be started again on the database meant."""


_OPENED: dict[Path, tuple[int, int]] = {}
"""The identity of each SQLite file when this process first connected to it, by any engine (one URL has two)."""


def watch_file_identity(engine: Engine, path: Path) -> None:
    """Raise DatabaseReplaced from `engine` once the file at `path` is not the one this process first opened there."""

    def check(*_args: object) -> None:
        if path in _OPENED:
            _check(path, _OPENED[path])

    def connected(*_args: object) -> None:
        _OPENED.setdefault(path, _identity(path))

    event.listen(engine, "do_connect", check)  # before SQLite would make a new, empty file in a deleted one's place
    event.listen(engine, "connect", connected)
    event.listen(engine, "begin", check)


def _identity(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_dev, found.st_ino


def _check(path: Path, opened: tuple[int, int]) -> None:
    try:
        now = _identity(path)
    except FileNotFoundError:
        raise DatabaseReplaced(f"database: {path} was deleted after this process opened it; nothing more is written "
                               f"(it would be lost). Restore the file, or start the process again on a new "
                               f"database") from None
    if now != opened:
        raise DatabaseReplaced(f"database: {path} was replaced by another file after this process opened it; "
                               f"nothing more is written. Start the process again to use the new file")
