"""The OpenAPI document as this server is configured: bearer security on writes, on reads only when private.

FastAPI declares bearer security on every operation whose dependencies look at a token; reads check
one only with `--private-reads`, so without it the document would tell generated clients that every
read needs one. Reads are this API's GET operations; every other method writes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def document_access(app: FastAPI, *, private_reads: bool) -> None:
    """Make `app.openapi()` describe which operations need a token on this server."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _set_security(generate(), private_reads)
        return app.openapi_schema

    app.openapi = openapi


def _set_security(schema: dict[str, Any], private_reads: bool) -> None:
    for operations in schema["paths"].values():
        for method, operation in operations.items():
            if "security" not in operation:
                continue  # open to everyone, like /health
            if method == "get" and not private_reads:
                del operation["security"]
                operation["responses"].pop("401", None)
            else:
                operation["security"] = [{"HTTPBearer": []}]
