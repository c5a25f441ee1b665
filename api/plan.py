"""Planning a study over REST: `POST /studies/plan` answers what `tuner plan --json` prints, for the document
`POST /studies` takes. Nothing is stored."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.data_access import DataAccess, DataAccessDep
from lm_tuner.api.deps import Unauthorized, Writer
from lm_tuner.api.schemas import SpecErrorsOut
from lm_tuner.api.submission import SPEC_BODY, SPEC_RESPONSES, parsed_spec, read_spec, spec_errors
from lm_tuner.api.submission_checks import server_machine
from lm_tuner.tuner.run.probe import study_plan
from lm_tuner.tuner.run.study_data import DatasetUnavailable
from lm_tuner.tuner.spec import SpecError, SpecIssue
from lm_tuner.tuner.spec.plan import StudyPlan

router = APIRouter()
SOURCE = "request body"


class QueryErrorOut(BaseModel):
    """FastAPI's answer to a query parameter it cannot read (`probe=maybe`)."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class QueryErrorsOut(BaseModel):
    detail: list[QueryErrorOut]


@router.post(
    "/studies/plan",
    response_model=StudyPlan,
    tags=["studies"],
    dependencies=[Writer],  # the probe trains models on this server
    responses={422: {"model": SpecErrorsOut | QueryErrorsOut,
                     "description": "the spec is invalid, or its dataset cannot be read (one entry per problem); or "
                                    "the query cannot be read"},
               **SPEC_RESPONSES, **Unauthorized},
    openapi_extra=SPEC_BODY,
)
async def plan(
    request: Request,
    access: DataAccessDep,
    probe: Annotated[bool, Query(description="time each family's median shape on this server (about 10 s, longer "
                                             "where one training step and one evaluation take longer) to estimate "
                                             "the study's duration")] = False,
) -> Any:
    """Each family's solved shapes across the searched ranges, where its parameters go, its trials and the
    warnings of `tuner plan`; with `probe`, the time per trial and for the study on this server. Studies that
    POST /studies would refuse are planned too, the reason among the warnings."""
    body = await read_spec(request)
    try:
        return await run_in_threadpool(_plan, body, probe, access)
    except SpecError as error:
        return spec_errors(error)


def _plan(body: bytes, probe: bool, access: DataAccess) -> StudyPlan:
    spec, _ = parsed_spec(body, SOURCE)
    access.check(spec)
    try:
        return study_plan(spec, probe=probe, machine=server_machine())
    except DatasetUnavailable as error:
        raise SpecError([SpecIssue("dataset", error.problem)], SOURCE) from error
