"""Request dependencies shared by the API routes and the dashboard pages: settings, study lookup, auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store import Storage, StudyView

SESSION_COOKIE = "lmt_token"  # the dashboard's sign-in: the token in an HttpOnly, SameSite=Strict cookie
_bearer = HTTPBearer(auto_error=False, description="a token from `tuner token create NAME`")


# The dependencies are coroutines: FastAPI runs a plain function in its thread pool, and that hop cost
# more than the work on the cheap endpoints. Database checks still run in the pool.
async def settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(settings)]
Unauthorized = {401: {"description": "a valid bearer token is required"}}  # documented on every guarded route
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class SignInRequired(HTTPException):
    """A dashboard page asked for without a valid token: the browser is sent to the sign-in page."""

    def __init__(self, detail: str) -> None:
        super().__init__(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def study_or_404(config: Settings, name: str) -> StudyView:
    found = Storage(config.storage_url).study(name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return found


def require_study(config: Settings, name: str) -> None:
    """404 unless the study exists (a cheap check; study_or_404 also loads counts and the best trial)."""
    if not Storage(config.storage_url).study_exists(name):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")


def presented_token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The bearer token of the Authorization header, else the dashboard's sign-in cookie."""
    return credentials.credentials if credentials is not None else request.cookies.get(SESSION_COOKIE)


def _refusal(config: Settings, token: str | None) -> str | None:
    """Why a request carrying `token` is refused, or None when it may go on."""
    storage = Storage(config.storage_url)
    if not storage.auth_enabled():
        return None
    if token is None:
        return "this server requires a bearer token"
    if not storage.token_is_valid(token):
        return "the bearer token is unknown or revoked"
    return None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def _opens_a_page(request: Request) -> bool:
    """A dashboard page a person opens (not a fragment or plot the page's script fetches)."""
    path = request.url.path
    return request.method == "GET" and path.startswith("/dashboard") and not path.startswith("/dashboard/fragments/")


async def require_writer(request: Request, config: SettingsDep, credentials: Credentials) -> None:
    """Every write needs a valid token while authentication is on."""
    refusal = await run_in_threadpool(_refusal, config, presented_token(request, credentials))
    if refusal:
        raise _unauthorized(refusal)


async def require_reader(request: Request, config: SettingsDep, credentials: Credentials) -> None:
    """Reads need a token only when the server was started with private reads."""
    if not config.private_reads:
        return
    refusal = await run_in_threadpool(_refusal, config, presented_token(request, credentials))
    if refusal:
        raise SignInRequired(refusal) if _opens_a_page(request) else _unauthorized(refusal)


Writer = Depends(require_writer)
Reader = Depends(require_reader)
