"""The FastAPI application: REST API (OpenAPI at /docs) and the dashboard pages."""

from __future__ import annotations

from fastapi import FastAPI

from api import pages, routes
from tuner.db import ensure_schema
from tuner.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    ensure_schema(settings.storage_url)
    app = FastAPI(
        title="lm-tuner",
        summary="Fair, tuned comparisons of recurrent language models",
        description="Submit studies (the same YAML/JSON spec `tuner launch` reads), follow their trials, "
                    "download the best checkpoints. The database is the single source of truth.",
    )
    app.state.settings = settings
    app.include_router(routes.router)
    app.include_router(pages.router)
    return app
