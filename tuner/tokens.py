"""API bearer tokens: created once (shown once), stored as SHA-256, revocable."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError

from tuner.db import ApiToken, sessions, utcnow


class TokenError(ValueError):
    pass


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(url: str, name: str) -> str:
    """A new token for `name`; the returned secret is not stored anywhere and cannot be shown again."""
    token = "lmt_" + secrets.token_urlsafe(32)
    try:
        with sessions(url).begin() as session:
            session.add(ApiToken(name=name, token_sha256=_digest(token)))
    except IntegrityError as error:
        raise TokenError(f"name: a token named {name!r} exists; revoke it or choose another name") from error
    return token


def revoke_token(url: str, name: str) -> None:
    with sessions(url).begin() as session:
        token = session.scalar(select(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None)))
        if token is None:
            raise TokenError(f"name: no active token named {name!r}")
        token.revoked_at = utcnow()


def list_tokens(url: str) -> list[ApiToken]:
    with sessions(url)() as session:
        return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at)))


def tokens_required(url: str) -> bool:
    """Tokens protect the API as soon as one active token exists."""
    with sessions(url)() as session:
        return bool(session.scalar(select(exists().where(ApiToken.revoked_at.is_(None)))))


def token_is_valid(url: str, token: str) -> bool:
    with sessions(url)() as session:
        return bool(session.scalar(select(exists().where(ApiToken.token_sha256 == _digest(token),
                                                          ApiToken.revoked_at.is_(None)))))
