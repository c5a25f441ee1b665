"""What every endpoint may be asked: URLs without control characters, ids and paging within the database's
32-bit integers, study names that can exist — each refused with a 4xx before any query runs —, and a 422 that
can always be written."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import Path as FastAPIPath
from fastapi import Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from lm_tuner.tuner.spec import INT32_MAX, NAME_PATTERN

PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]*$"  # free text in a URL: no control character
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
SECRET_NAME = re.compile(r"(^|[\W_])(token|secret|passw(or)?d|credentials?|key|csrf|cookie|authori[sz]ation)($|[\W_])",
                         re.IGNORECASE)
HIDDEN = "(hidden: a secret)"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
BAD_URL = {400: {"description": "the URL holds a control character (%00 among them)"}}  # documented on every route

Limit = Annotated[int, Query(ge=1, le=1000, description="items per page")]
Offset = Annotated[int, Query(ge=0, le=INT32_MAX, description="items to skip")]
TrialId = Annotated[int, FastAPIPath(ge=1, le=INT32_MAX, description="the trial's id (Optuna's trial_id)")]
StudyName = Annotated[str, FastAPIPath(pattern=NAME_PATTERN, description="the study's name (a name no study can "
                                                                         "have is refused before any query)")]


def text_query(max_length: int, description: str | None = None) -> Any:
    """A free-text query parameter (a name filter, a family): at most `max_length` characters, no control
    character (documented in the schema; the middleware below refuses them anyway)."""
    return Query(max_length=max_length, pattern=PRINTABLE, description=description)


class RefuseControlCharacters:
    """ASGI middleware: 400 for a request whose path or query string holds a control character (%00 among them).
    No endpoint has a use for one, and PostgreSQL refuses NUL in text."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            query = unquote_to_bytes(scope["query_string"].replace(b"+", b" ")).decode("utf-8", "replace")
            for part, text in (("path", scope["path"]), ("query string", query)):
                if found := _CONTROL_CHARACTER.search(text):
                    detail = (f"the URL's {part} holds the control character U+{ord(found.group()):04X}; "
                              f"allowed: printable characters")
                    await JSONResponse({"detail": detail}, status.HTTP_400_BAD_REQUEST)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


async def answer_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, except that inputs JSON cannot carry — NaN and infinities (which Python's JSON parser reads
    from a body), bytes that are not UTF-8 (a body sent without a JSON content type) — are echoed as text
    instead of failing the answer with a 500, and that no secret is echoed (_without_secrets)."""
    form = request.headers.get("content-type", "").split(";")[0].strip().lower() in FORM_TYPES
    errors = [_without_secrets(item, form) for item in error.errors()]
    return JSONResponse({"detail": jsonable_encoder(_json_safe(errors))}, status.HTTP_422_UNPROCESSABLE_CONTENT)


def _without_secrets(item: dict[str, Any], form: bool) -> dict[str, Any]:
    """A validation error without the `input` of a secret: of anything sent in a header, a cookie or an HTML form
    (where the dashboard's token, form token and any password travel), or of a field named like a secret (token,
    secret, password, credential, key); of a mapping, its secret-named entries are hidden."""
    loc = [str(part) for part in item.get("loc", ())]
    if "input" not in item:
        return item
    if loc[:1] in (["header"], ["cookie"]) or (form and loc[:1] == ["body"]) or any(map(SECRET_NAME.search, loc)):
        return {key: value for key, value in item.items() if key != "input"}
    if isinstance(item["input"], dict):
        return {**item, "input": {key: HIDDEN if SECRET_NAME.search(str(key)) else value
                                  for key, value in item["input"].items()}}
    return item


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value
