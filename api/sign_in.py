"""The dashboard's sign-in: a token pasted once, then carried by an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.csrf import page_token
from lm_tuner.api.deps import SESSION_COOKIE, SettingsDep, SignInRequired
from lm_tuner.dashboards import render
from lm_tuner.tuner.store import Storage

router = APIRouter(include_in_schema=False)

SIGN_IN = "/dashboard/sign-in"
SIGN_OUT = "/dashboard/sign-out"
SIGNED_IN_COOKIE = "lmt_signed_in"  # not secret and readable by the page's script: shows the sign-out button
COOKIE_SECONDS = 30 * 24 * 3600
MAX_TOKEN_LENGTH = 512


@router.get(SIGN_IN, response_class=HTMLResponse)
def sign_in_page(request: Request,
                 next_page: Annotated[str, Query(alias="next", max_length=2048)] = "/dashboard") -> str:
    return render("sign_in.html", next_page=_local(next_page), error=None, refresh_ms=0, csrf_token=page_token(request))


@router.post(SIGN_IN)
async def sign_in(request: Request, config: SettingsDep, token: Annotated[str, Form(max_length=MAX_TOKEN_LENGTH)],
                  next_page: Annotated[str, Form(alias="next", max_length=2048)] = "/dashboard") -> Response:
    """A valid token sets the session cookie and returns to the page asked for; anything else shows the form."""
    token = token.strip()
    if not token or not await run_in_threadpool(Storage(config.storage_url).token_is_valid, token):
        page = render("sign_in.html", next_page=_local(next_page), error="unknown or revoked token", refresh_ms=0,
                      csrf_token=page_token(request))
        return HTMLResponse(page, status_code=status.HTTP_401_UNAUTHORIZED)
    response = RedirectResponse(_local(next_page), status_code=status.HTTP_303_SEE_OTHER)
    secure = request.url.scheme == "https"
    response.set_cookie(SESSION_COOKIE, token, max_age=COOKIE_SECONDS, httponly=True, samesite="strict",
                        secure=secure)
    response.set_cookie(SIGNED_IN_COOKIE, "1", max_age=COOKIE_SECONDS, samesite="strict", secure=secure)
    return response


@router.post(SIGN_OUT)
def sign_out() -> Response:
    response = RedirectResponse(SIGN_IN, status_code=status.HTTP_303_SEE_OTHER)
    for cookie in (SESSION_COOKIE, SIGNED_IN_COOKIE):
        response.delete_cookie(cookie, samesite="strict")
    return response


async def send_to_sign_in(request: Request, _error: SignInRequired) -> Response:
    """The answer to a dashboard page opened without a valid token: the sign-in page, then back here."""
    asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{SIGN_IN}?next={quote(asked, safe='')}", status_code=status.HTTP_303_SEE_OTHER)


def _local(page: str) -> str:
    """Only pages of this dashboard are returned to: never another site (an open redirect)."""
    return page if page.startswith("/dashboard") and not page.startswith(SIGN_IN) else "/dashboard"
