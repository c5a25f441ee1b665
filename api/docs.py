"""The API's documentation pages, Swagger UI at /docs and ReDoc at /redoc, served from the package.

FastAPI's own pages load both from a CDN, and a machine without internet shows a blank page. These are the
same pages (FastAPI's Swagger UI settings, its OAuth2 redirect page) on the vendored bundles
(dashboards/static/vendor/README.md), each script in a file of its own: no inline script, so a
Content-Security-Policy allowing only same-origin scripts holds. ReDoc's page states its own policy (REDOC_POLICY).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import swagger_ui_default_parameters
from fastapi.responses import HTMLResponse

from lm_tuner.dashboards import render

router = APIRouter(include_in_schema=False)

SWAGGER_UI = "/docs"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
REDOC = "/redoc"
# As strict as every page's, but ReDoc adds its styles as <style> elements (styled-components) and runs its search in
# a worker made from a blob: URL (both made by its own script, from this server); it shows Redocly's logo from
# cdn.redoc.ly, whatever its options say: refused, so the page asks nothing of another host (the image then hides).
REDOC_POLICY = ("default-src 'none'; script-src 'self'; worker-src 'self' blob:; "
                "style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data:; font-src 'self'; connect-src 'self'; form-action 'none'; "
                "frame-ancestors 'none'; base-uri 'none'")
# Swagger UI sends the address of a spec on another host to validator.swagger.io for its badge: not offline.
OFFLINE_PARAMETERS = {"validatorUrl": None}


@router.get(SWAGGER_UI, response_class=HTMLResponse)
def swagger_ui(request: Request) -> str:
    app = request.app
    parameters = {**swagger_ui_default_parameters, **(app.swagger_ui_parameters or {}), **OFFLINE_PARAMETERS}
    return render("api_docs.html", title=f"{app.title} - Swagger UI", openapi_url=_openapi_url(request),
                  parameters=parameters, oauth2_redirect_url=_root(request) + OAUTH2_REDIRECT)


@router.get(OAUTH2_REDIRECT, response_class=HTMLResponse)
def swagger_ui_oauth2_redirect() -> str:
    return render("api_docs_oauth2_redirect.html")


@router.get(REDOC, response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    page = render("api_redoc.html", title=f"{request.app.title} - ReDoc", openapi_url=_openapi_url(request))
    return HTMLResponse(page, headers={"Content-Security-Policy": REDOC_POLICY})


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


def _openapi_url(request: Request) -> str:
    return _root(request) + request.app.openapi_url
