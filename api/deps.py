"""Request dependencies shared by the API routes and the dashboard pages: settings, study lookup, auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from tuner.results import StudyView, get_study, study_exists
from tuner.settings import Settings
from tuner.tokens import token_is_valid, tokens_required

_bearer = HTTPBearer(auto_error=False, description="a token from `tuner token create NAME`")


# The dependencies are coroutines: FastAPI runs a plain function in its thread pool, and that hop cost
# more than the work on the cheap endpoints. Database checks still run in the pool.
async def settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(settings)]
Unauthorized = {401: {"description": "a valid bearer token is required"}}  # documented on every guarded route
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def study_or_404(config: Settings, name: str) -> StudyView:
    found = get_study(config.storage_url, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return found


def require_study(config: Settings, name: str) -> None:
    """404 unless the study exists (a cheap check; study_or_404 also loads counts and the best trial)."""
    if not study_exists(config.storage_url, name):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")


def _check(config: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    if not tokens_required(config.storage_url):
        return
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "this server requires a bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    if not token_is_valid(config.storage_url, credentials.credentials):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "the bearer token is unknown or revoked",
                            headers={"WWW-Authenticate": "Bearer"})


async def require_writer(config: SettingsDep, credentials: Credentials) -> None:
    """Every write needs a valid token once any token exists."""
    await run_in_threadpool(_check, config, credentials)


async def require_reader(config: SettingsDep, credentials: Credentials) -> None:
    """Reads need a token only when the server was started with private reads."""
    if config.private_reads:
        await run_in_threadpool(_check, config, credentials)


Writer = Depends(require_writer)
Reader = Depends(require_reader)
