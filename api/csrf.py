"""The dashboard's form token: what a page of this server can send and a page of another site cannot.

A browser attaches the sign-in cookie to requests that any site starts, so a write carrying that cookie must also
carry a token the page was given: the HMAC of the cookie's secret, written into each page (never into a cookie:
cookies are shared by every port of a host, and a page on another port could read or plant one). Before sign-in
the sign-in form's token is bound the same way to a random cookie of its own, so that a forged sign-in (into an
attacker's token) fails too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from fastapi import Request

from lm_tuner.api.deps import SESSION_COOKIE

FORM_COOKIE = "lmt_form"  # the sign-in form's seed while no session cookie exists
FORM_FIELD = "csrf_token"  # in the dashboard's HTML forms
FORM_HEADER = "X-CSRF-Token"  # on the dashboard scripts' requests
FORM_COOKIE_SECONDS = 30 * 24 * 3600
NEW_SEED = "new_form_seed"  # in a request's state: the form cookie a page made, for the guard to set
_PURPOSE = b"lm-tuner dashboard form token"


def form_token(seed: str) -> str:
    return hmac.new(seed.encode("utf-8", "surrogateescape"), _PURPOSE, hashlib.sha256).hexdigest()


def seed_of(cookies: Mapping[str, str]) -> str | None:
    """What a request's form token is bound to: the sign-in cookie, else the form cookie."""
    return cookies.get(SESSION_COOKIE) or cookies.get(FORM_COOKIE)


def token_matches(given: str | None, seed: str | None) -> bool:
    return given is not None and seed is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                                          form_token(seed).encode())


def page_token(request: Request) -> str:
    """The form token of a page rendered for this request: bound to its sign-in cookie or form cookie, else to a
    new form cookie, which the guard gives the response (api/guard.py)."""
    seed = seed_of(request.cookies)
    if seed is None:
        seed = request.scope.setdefault("state", {}).setdefault(NEW_SEED, secrets.token_urlsafe(32))
    return form_token(seed)
