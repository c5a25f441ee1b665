"""Checking a spec over REST without creating anything: `POST /studies/validate` answers what POST /studies would
(a 422 listing every problem, each at its line, in the words of the CLI: data that cannot be read, a budget no
model fits at the data's vocabulary and a taken name among them; else the plan's warnings), but stores nothing.
The dashboard's editor asks it as the user types: the data is read once per server process (the corpus is kept),
and a registered dataset not downloaded yet is not fetched."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.data_access import DataAccess, DataAccessDep
from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized
from lm_tuner.api.schemas import SpecErrorsOut
from lm_tuner.api.submission import SPEC_BODY, SPEC_RESPONSES, parsed_spec, read_spec, spec_errors
from lm_tuner.api.submission_checks import data_checks
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import SpecError, SpecIssue
from lm_tuner.tuner.spec.issues import line_of
from lm_tuner.tuner.spec.yaml_loader import load_document
from lm_tuner.tuner.store import Storage

router = APIRouter()
SOURCE = "request body"


class ValidSpecOut(BaseModel):
    name: str = Field(description="the study the spec declares; POST /studies would queue it")
    warnings: list[str] = Field(description="what POST /studies would warn about: the plan's warnings on the "
                                            "study's shapes at its data's vocabulary")


@router.post(
    "/studies/validate",
    response_model=ValidSpecOut,
    tags=["studies"],
    dependencies=[Reader],
    responses={422: {"model": SpecErrorsOut, "description": "every problem POST /studies would refuse the spec for, "
                                                         "a taken name among them; `line` is the document's, 1-based"},
               **SPEC_RESPONSES, **Unauthorized},
    openapi_extra=SPEC_BODY,
)
async def validate(request: Request, config: SettingsDep, access: DataAccessDep) -> Any:
    """Check a study spec (the document POST /studies takes) as POST /studies would; nothing is stored. A spec whose
    data is in this server's own folders needs a token where the server has tokens, as POST /studies does."""
    body = await read_spec(request)
    try:
        name, warnings = await run_in_threadpool(_checked, config, body, access)
    except SpecError as error:
        return spec_errors(error)
    return ValidSpecOut(name=name, warnings=warnings)


def _checked(config: Settings, body: bytes, access: DataAccess) -> tuple[str, list[str]]:
    """The name of the study the body declares and what POST /studies would warn about, or SpecError with every
    problem placed at its line. Reads the data: run in the thread pool."""
    spec, document = parsed_spec(body, SOURCE)
    lines = load_document(document)[1]  # parse_spec has read it: it loads
    access.check(spec)
    found, warnings = data_checks(spec)
    issues = [SpecIssue(i.field, i.message, i.line or line_of(tuple(i.field.split(".")), lines)) for i in found]
    if Storage(config.storage_url).study_exists(spec.name):  # the 409 of POST /studies, in its words
        issues.append(SpecIssue("name", f"a study named {spec.name!r} already exists; choose another name",
                                lines.get(("name",))))
    if issues:
        raise SpecError(issues, SOURCE)
    return spec.name, warnings

