"""Ray's settings for a launch whose output a user can act on: Ray's and Tune's own reports off, its warnings
about its own choices off, its errors (and a trial's) left alone. Every setting is one Ray documents, and each
is only a default: a variable the user has set wins."""

from __future__ import annotations

import logging
import os

QUIET_ENVIRONMENT = {
    # Tune's newer console output prints experiment banners and status tables even at verbose=0; the classic one
    # prints nothing at verbose=0 but errors.
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune warns when one of its loop's steps, callbacks included, takes over 0.5 s ("may be a performance
    # bottleneck"); the project's callbacks read and write the database, and nothing in the warning is the user's
    # to act on. Read when ray.tune is first imported: effective where set before that.
    "TUNE_WARN_THRESHOLD_S": "30",
}


AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropAuthNotice(logging.Filter):
    """Ray announces that the local Ray it starts uses token authentication, its default: nothing to act on. A
    warning that authentication is off (or any other) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(AUTH_NOTICE)


_DROP_AUTH_NOTICE = _DropAuthNotice()  # one instance: adding it again is a no-op


def quiet_environment() -> None:
    """QUIET_ENVIRONMENT's defaults in this process (and the Ray processes it starts)."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def quiet_ray() -> None:
    """Ray quiet for a run; call before `ray.init`. Ray's authentication mode is left as Ray and the user chose it
    (setting RAY_AUTH_MODE here would leak into every Ray started later from this process, tests' clusters too)."""
    quiet_environment()
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_DROP_AUTH_NOTICE)
