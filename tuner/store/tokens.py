"""API bearer tokens (created once, shown once, stored as SHA-256, revocable) and whether the API needs them.

Whether authentication is on is a state of its own in the database, not inferred from the tokens:
creating a token turns it on, and only an explicit `set_auth(url, False)` (`tuner auth off`) turns it
off again. Revoking the last token therefore locks writes until a new token is created; it never
opens the API.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError

from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import ApiToken, SettingRecord, utcnow

AUTH_SETTING = "auth"
TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_SECRET_LENGTH = 24


class TokenError(ValueError):
    pass


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(url: str, name: str, secret: str | None = None) -> str:
    """A new token for `name`, and authentication turned on. The returned secret is not stored anywhere and
    cannot be shown again; `secret` registers a given one (e.g. from a deployment's secret store) instead."""
    if not TOKEN_NAME.fullmatch(name):
        raise TokenError(f"name: got {name!r}; allowed: 1-64 letters, digits, '_', '.' or '-', starting with a "
                         f"letter or digit")
    if secret is not None and (len(secret) < MIN_SECRET_LENGTH or not secret.isprintable() or " " in secret):
        raise TokenError(f"secret: a token must be at least {MIN_SECRET_LENGTH} printable characters without spaces")
    token = secret if secret is not None else "lmt_" + secrets.token_urlsafe(32)
    try:
        with sessions(url).begin() as session:
            session.add(ApiToken(name=name, token_sha256=_digest(token)))
            _set(session, AUTH_SETTING, "on")
    except IntegrityError as error:
        raise TokenError(f"name: a token named {name!r} exists (or this secret is already registered); revoke it "
                         f"or choose another name") from error
    return token


def initial_token(url: str, name: str, secret: str | None = None) -> str | None:
    """A deployment's first token: created (and authentication turned on) only on the first start, that is
    while authentication is off and no token named `name` was ever made. Returns the new secret, else None:
    a later start, or an operator's explicit `tuner auth off`, is left as it is."""
    if auth_enabled(url) or _named(url, name):
        return None
    try:
        return create_token(url, name, secret)
    except TokenError:
        if _named(url, name):  # another replica started at the same moment and made it
            return None
        raise


def revoke_token(url: str, name: str) -> None:
    """Revoke a token; authentication stays on (with no active token left, writes are locked)."""
    with sessions(url).begin() as session:
        token = session.scalar(select(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None)))
        if token is None:
            raise TokenError(f"name: no active token named {name!r}")
        token.revoked_at = utcnow()


def list_tokens(url: str) -> list[ApiToken]:
    with sessions(url)() as session:
        return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at)))


def auth_enabled(url: str) -> bool:
    """Whether writes (and, with private reads, reads) need a valid token."""
    with sessions(url)() as session:
        return session.scalar(select(SettingRecord.value).where(SettingRecord.key == AUTH_SETTING)) == "on"


def set_auth(url: str, enabled: bool) -> None:
    """Turn authentication on (which needs an active token, else nobody could write) or off."""
    with sessions(url).begin() as session:
        if enabled and not session.scalar(select(exists().where(ApiToken.revoked_at.is_(None)))):
            raise TokenError("auth: there is no active token; create one with `tuner token create NAME`, which "
                             "also turns authentication on")
        _set(session, AUTH_SETTING, "on" if enabled else "off")


def token_is_valid(url: str, token: str) -> bool:
    with sessions(url)() as session:
        return bool(session.scalar(select(exists().where(ApiToken.token_sha256 == _digest(token),
                                                          ApiToken.revoked_at.is_(None)))))


def _named(url: str, name: str) -> bool:
    with sessions(url)() as session:
        return bool(session.scalar(select(exists().where(ApiToken.name == name))))


def _set(session, key: str, value: str) -> None:
    record = session.get(SettingRecord, key, with_for_update=True)
    if record is None:
        session.add(SettingRecord(key=key, value=value))
    else:
        record.value = value
