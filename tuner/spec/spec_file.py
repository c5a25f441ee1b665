"""A spec file opened for reading that cannot hang: a user may point `--space` at a FIFO, a folder, a device or a
socket, and opening a FIFO for reading waits for a writer forever. Only a regular file is read."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotARegularFile(OSError):
    """The path names something other than a regular file; `kind` says what ("a FIFO (named pipe)")."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a regular file")
        self.path = path
        self.kind = kind


def special_kind(mode: int) -> str | None:
    """What a file of this `st_mode` is, where it is not a regular file ("a folder", "a socket"...); else None."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def refuse_special(path: Path) -> None:
    """NotARegularFile where `path` (links followed) is not a regular file; stat never waits, whatever it names.
    A missing path passes: opening it says so."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if kind := special_kind(mode):
        raise NotARegularFile(path, kind)


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading, or NotARegularFile: opened without waiting (O_NONBLOCK: a FIFO opens at once
    instead of waiting for a writer), then checked on the open descriptor, so a file swapped for a FIFO after a
    check is refused too. A socket cannot be opened (OSError ENXIO)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if kind := special_kind(os.fstat(descriptor).st_mode):
            raise NotARegularFile(path, kind)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
