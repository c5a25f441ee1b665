"""Submitting a study over REST: the body is the same YAML or JSON document `tuner launch --space` reads,
validated with the same messages, size-limited while it is read."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.data_access import DATA_ACCESS, DataAccess, DataAccessDep
from lm_tuner.api.deps import SettingsDep, Unauthorized, Writer
from lm_tuner.api.guard import GUARDED
from lm_tuner.api.schemas import (
    SpecErrorsOut,
    SpecIssueOut,
    SubmittedOut,
)
from lm_tuner.api.submission_checks import data_checks, submission_cost
from lm_tuner.tuner.analysis.study_facts import unigram_baseline
from lm_tuner.tuner.run.controller import StudyConflict, refuse_mismatched_artifacts
from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import MAX_SPEC_BYTES, SpecError, SpecIssue, StudySpec, parse_spec
from lm_tuner.tuner.spec.plan import StudyCost

router = APIRouter()
SPEC_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "application/json")
"""The content types of a spec document (YAML, or JSON, which YAML reads); a body without one is read as YAML."""
SPEC_BODY = {"requestBody": {"required": True, "content": {
    "application/yaml": {"schema": {"type": "string", "description": "a study spec in YAML"}},
    "application/json": {"schema": {"type": "object", "description": "a study spec (docs/spec.md)"}},
}}}
"""The OpenAPI request body of a route that reads a spec document."""
SPEC_RESPONSES = {413: {"description": "body too large"},
                  415: {"description": f"a content type other than {', '.join(SPEC_TYPES)}"}, **GUARDED, **DATA_ACCESS}
"""The answers of every route that reads a spec document, besides its own."""


@router.post(
    "/studies",
    response_model=SubmittedOut,
    status_code=status.HTTP_202_ACCEPTED,
    tags=["studies"],
    dependencies=[Writer],
    responses={422: {"model": SpecErrorsOut, "description": "the spec is invalid; one entry per problem"},
               409: {"description": "a study with this name exists, or the artifact store holds checkpoints of an "
                                    "earlier one"}, **SPEC_RESPONSES, **Unauthorized},
    openapi_extra=SPEC_BODY,
)
async def submit(request: Request, config: SettingsDep, access: DataAccessDep) -> Any:
    """Queue a study. The body is the same YAML (or JSON) document `tuner launch --space` reads (Content-Type
    application/yaml or application/json)."""
    body = await read_spec(request)
    try:
        return await queue_study(config, body, "request body", access)
    except SpecError as error:
        return spec_errors(error)


async def queue_study(config: Settings, body: bytes, source: str, access: DataAccess) -> SubmittedOut:
    """Validate a spec document against its data and queue its study, with the plan's warnings; SpecError names
    `source` (also for data that cannot be read), 409 for a taken name or files of an earlier study of that name in
    the artifact store, 401 or 403 for data the request may not make this server read."""
    spec, document, warnings, unigram, cost = await run_in_threadpool(_submitted_spec, body, source, access)
    try:
        await run_in_threadpool(refuse_mismatched_artifacts, config.storage_url, spec.name, config.artifact_root)
        await run_in_threadpool(submit_study, config.storage_url, spec, document, unigram_perplexity=unigram)
    except StudyConflict as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    return SubmittedOut(name=spec.name, status="queued", url=f"/studies/{spec.name}", warnings=warnings, cost=cost)


def spec_errors(error: SpecError) -> JSONResponse:
    """422 with one entry per problem of the spec."""
    issues = [SpecIssueOut(field=i.field, message=i.message, line=i.line) for i in error.issues]
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
                        content={"detail": [issue.model_dump() for issue in issues]})


def _submitted_spec(body: bytes, source: str, access: DataAccess
                    ) -> tuple[StudySpec, str, list[str], float | None, StudyCost | None]:
    """The spec of a request body, its text, the plan's warnings, the unigram perplexity of its data (None where
    this server has not read the data) and its cost, or SpecError (with what a queued study would certainly fail on).
    Run in the thread pool: however the body is made, and however long its data takes to read, the event loop keeps
    answering."""
    spec, document = parsed_spec(body, source)
    access.check(spec)
    issues, warnings = data_checks(spec)
    if issues:
        raise SpecError(issues, source)
    unigram = unigram_baseline(spec.model_dump(mode="json")).perplexity  # the data is cached
    return spec, document, warnings, unigram, submission_cost(spec)


def parsed_spec(body: bytes, source: str) -> tuple[StudySpec, str]:
    """A request body validated as a spec, with its text; SpecError names `source`."""
    try:
        document = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError([SpecIssue("", "the body must be UTF-8 text")]) from error
    return parse_spec(document, source=source), document


async def read_spec(request: Request) -> bytes:
    """A spec document's body: 415 for another content type than SPEC_TYPES, 413 beyond MAX_SPEC_BYTES."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media not in SPEC_TYPES:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            f"Content-Type {media}: a study spec is sent as {', '.join(SPEC_TYPES[:-1])} or "
                            f"{SPEC_TYPES[-1]} (or without Content-Type, read as YAML)")
    return await read_limited(request, MAX_SPEC_BYTES)


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it exceeds `limit` (also when no Content-Length is sent)."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > len(str(limit)) or int(declared) > limit):
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"a spec may be at most {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"a spec may be at most {limit} bytes")
    return bytes(body)
