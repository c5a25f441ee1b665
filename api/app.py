"""The FastAPI application: REST API (OpenAPI at /docs) and the dashboard pages."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from lm_tuner.api import docs, pages, plan, plots, routes, sensitivity, sign_in, spaces, submission, trials, validation
from lm_tuner.api.deps import SignInRequired
from lm_tuner.api.guard import RequestGuard
from lm_tuner.api.headers import SecurityHeaders
from lm_tuner.api.hosts import normalised_hosts
from lm_tuner.api.openapi import document_access
from lm_tuner.api.params import BAD_URL, RefuseControlCharacters, answer_validation_error
from lm_tuner.api.storage_errors import answer_storage_errors
from lm_tuner.api.tuning_curves import router as tuning_curves_router
from lm_tuner.tuner.lifetime import freeze_loaded_objects
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store import Storage


def create_app(settings: Settings) -> FastAPI:
    Storage(settings.storage_url).upgrade()
    app = FastAPI(
        title="lm-tuner",
        summary="Fair, tuned comparisons of recurrent language models",
        description="Submit studies (the same YAML/JSON spec `tuner launch` reads), follow their trials, "
                    "download the best checkpoints. The database is the single source of truth.",
        responses=BAD_URL,
        docs_url=None, redoc_url=None,  # api/docs.py serves both pages from the package, not from a CDN
    )
    app.state.settings = settings
    app.add_middleware(RefuseControlCharacters)  # %00 and friends: 400 before any route or query
    app.add_middleware(RequestGuard, allowed_hosts=normalised_hosts(settings.allowed_hosts))  # before any route
    app.add_middleware(SecurityHeaders)  # outermost: the guard's refusals get the headers too
    app.include_router(routes.router)
    app.include_router(submission.router)
    app.include_router(plan.router)
    app.include_router(validation.router)
    app.include_router(trials.router)
    app.include_router(spaces.router)
    app.include_router(plots.router)
    app.include_router(sensitivity.router)
    app.include_router(tuning_curves_router)
    app.include_router(pages.router)
    app.include_router(sign_in.router)
    app.include_router(docs.router)
    app.add_exception_handler(SignInRequired, sign_in.send_to_sign_in)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, answer_validation_error)
    answer_storage_errors(app)  # 503 for a SQLite file gone, 507 for a full disk: never a bare 500
    document_access(app, private_reads=settings.private_reads)
    freeze_loaded_objects()  # what is loaded by now lives as long as the process; requests wait on no scan of it
    return app


async def _http_error(request: Request, error: StarletteHTTPException) -> Response:
    """FastAPI's answer, except that a 405 lists every method of the path in Allow, not one route's."""
    if error.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        methods = {method for route in request.app.routes if isinstance(route, Route)
                   and route.matches(request.scope)[0] != Match.NONE for method in route.methods or ()}
        error.headers = {**(error.headers or {}), "Allow": ", ".join(sorted(methods))}
    return await http_exception_handler(request, error)
