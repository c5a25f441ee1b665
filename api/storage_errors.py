"""What a request is answered when the database cannot keep what it writes: a SQLite file deleted or replaced under
the server (503), a full disk (507 Insufficient Storage) on SQLite, PostgreSQL or the server's own files. The answer
says so, never a bare 500, and nothing is acknowledged that was not stored."""

from __future__ import annotations

import errno
import logging
import sqlite3

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError

from lm_tuner.tuner.store import DatabaseReplaced

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
POSTGRES_DISK_FULL = "53100"  # SQLSTATE disk_full

log = logging.getLogger(__name__)


def answer_storage_errors(app: FastAPI) -> None:
    """Register the answers below on `app`."""
    app.add_exception_handler(DatabaseReplaced, _replaced)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(OSError, _file_error)


async def _replaced(request: Request, error: DatabaseReplaced) -> JSONResponse:
    log.error("%s %s refused: %s", request.method, request.url.path, error)
    return JSONResponse({"detail": str(error)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


async def _database_error(request: Request, error: DBAPIError) -> JSONResponse:
    if not database_full(error):
        raise error  # a bare 500 with its traceback in the server's log, as any other error
    return _full(request, "the database's disk is full")


async def _file_error(request: Request, error: OSError) -> JSONResponse:
    if error.errno not in FULL_ERRNOS:
        raise error
    return _full(request, f"the server's disk is full ({error.strerror.lower()})" if error.strerror else
                 "the server's disk is full")


def database_full(error: DBAPIError) -> bool:
    """Whether the database refused a write for want of space: SQLite's SQLITE_FULL ("database or disk is full"),
    PostgreSQL's disk_full."""
    cause = error.orig
    if isinstance(cause, sqlite3.Error):
        return getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(cause)
    return getattr(cause, "sqlstate", None) == POSTGRES_DISK_FULL


def _full(request: Request, what: str) -> JSONResponse:
    log.error("%s %s refused: %s", request.method, request.url.path, what)
    return JSONResponse({"detail": f"{what}: nothing was stored; free space on it and send the request again"},
                        status_code=status.HTTP_507_INSUFFICIENT_STORAGE)
