"""REST endpoints: studies (submit, list, detail, cancel, delete), trials, Pareto, checkpoints."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import FileResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized, Writer, require_study, study_or_404
from lm_tuner.api.params import Limit, Offset, StudyName, TrialId, text_query
from lm_tuner.api.schemas import (
    ComparisonOut,
    EvaluationOut,
    ParetoOut,
    ParetoPoint,
    SpecErrorsOut,
    SpecIssueOut,
    StatusOut,
    StudyDetailOut,
    StudyOut,
    StudyPage,
    SubmittedOut,
    TrialDetailOut,
    TrialOut,
    TrialPage,
    TurnOut,
)
from lm_tuner.dashboards import figure_json, non_dominated, pareto_figure
from lm_tuner.tuner.analysis import study_unit, trial_evaluations
from lm_tuner.tuner.comparison import comparison
from lm_tuner.tuner.controller import StudyConflict
from lm_tuner.tuner.feasibility import submission_issues
from lm_tuner.tuner.lifecycle import StudyStateError, cancel_study, delete_study
from lm_tuner.tuner.queue import submit_study
from lm_tuner.tuner.results import (
    Page,
    TrialView,
    get_trial,
    learning_curve,
    list_studies,
    pareto_frame,
    study_trials,
)
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import MAX_SPEC_BYTES, SpecError, SpecIssue, StudySpec, parse_spec

PARETO_AXES = {
    "params": ("parameter_count", "trainable parameters"),
    "wall_seconds": ("wall_seconds", "training wall time (s)"),
    "gpu_seconds": ("gpu_seconds", "GPU time reserved (s)"),
}

router = APIRouter()
StateFilter = Annotated[Literal["COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING"] | None,
                        Query(description="only trials in this state")]
NotFound = {404: {"description": "no such study or trial"}}


@router.get("/health", tags=["service"])
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/studies", response_model=StudyPage, tags=["studies"], dependencies=[Reader], responses=Unauthorized)
async def studies(
    config: SettingsDep,
    status_filter: Annotated[Literal["queued", "running", "cancelling", "cancelled", "complete", "failed"] | None,
                             Query(alias="status", description="only studies in this status")] = None,
    family: Annotated[str | None, text_query(32, "only studies comparing this family")] = None,
    q: Annotated[str | None, text_query(64, "name contains")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> StudyPage:
    page = await run_in_threadpool(list_studies, config.storage_url, status=status_filter, family=family,
                                   name_contains=q, limit=limit, offset=offset)
    return StudyPage(items=[StudyOut.of(s) for s in page.items], total=page.total, limit=limit, offset=offset)


@router.post(
    "/studies",
    response_model=SubmittedOut,
    status_code=status.HTTP_202_ACCEPTED,
    tags=["studies"],
    dependencies=[Writer],
    responses={422: {"model": SpecErrorsOut, "description": "the spec is invalid; one entry per problem"},
               409: {"description": "a study with this name exists"}, 413: {"description": "body too large"},
               **Unauthorized},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/yaml": {"schema": {"type": "string", "description": "a study spec in YAML"}},
        "application/json": {"schema": {"type": "object", "description": "a study spec (docs/spec.md)"}},
    }}},
)
async def submit(request: Request, config: SettingsDep) -> Any:
    """Queue a study. The body is the same YAML (or JSON) document `tuner launch --space` reads."""
    body = await _read_limited(request, MAX_SPEC_BYTES)
    try:
        spec, document = await run_in_threadpool(_submitted_spec, body)
    except SpecError as error:
        return _spec_errors([SpecIssueOut(field=i.field, message=i.message, line=i.line) for i in error.issues])
    try:
        await run_in_threadpool(submit_study, config.storage_url, spec, document)
    except StudyConflict as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    return SubmittedOut(name=spec.name, status="queued", url=f"/studies/{spec.name}")


@router.get("/studies/{name}", response_model=StudyDetailOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def study(name: StudyName, config: SettingsDep) -> StudyDetailOut:
    """Status, trial counts by state, progress and ETA, the best trial, and the spec as submitted."""
    return StudyDetailOut.of(await run_in_threadpool(study_or_404, config, name))


@router.post("/studies/{name}/cancel", response_model=StatusOut, status_code=status.HTTP_202_ACCEPTED,
             tags=["studies"], dependencies=[Writer],
             responses={**NotFound, **Unauthorized, 409: {"description": "the study has already ended"}})
def cancel(name: StudyName, config: SettingsDep) -> StatusOut:
    """Cancel a queued study at once, or a running one within seconds (its running trials stop)."""
    try:
        return StatusOut(name=name, status=cancel_study(config.storage_url, name))
    except KeyError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}") from error
    except StudyStateError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error


@router.delete("/studies/{name}", status_code=status.HTTP_204_NO_CONTENT, tags=["studies"], dependencies=[Writer],
               responses={**NotFound, **Unauthorized, 409: {"description": "the study is still running"}})
def remove(name: StudyName, config: SettingsDep) -> Response:
    """Delete a study that is not running: its trials, learning curves and checkpoint files."""
    try:
        delete_study(config.storage_url, name, config.artifact_root)
    except KeyError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}") from error
    except StudyStateError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/studies/{name}/trials", response_model=TrialPage, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def trials(
    name: StudyName,
    config: SettingsDep,
    state: StateFilter = None,
    family: Annotated[str | None, text_query(32, "only this family's trials")] = None,
    stage: Annotated[Literal["tune", "rerun", "dyneval"] | None,
                     Query(description="only tuning trials, reruns or stage-2 trials")] = None,
    sort: Annotated[Literal["number", "value", "family", "state", "started"],
                    Query(description="value: best first, unfinished last")] = "number",
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    limit: Limit = 100,
    offset: Offset = 0,
) -> TrialPage:
    def page_of_trials() -> Page[TrialView]:
        require_study(config, name)
        return study_trials(config.storage_url, name, state=state, family=family, stage=stage, sort=sort,
                            descending=order == "desc", limit=limit, offset=offset)

    page = await run_in_threadpool(page_of_trials)
    return TrialPage(items=[TrialOut.of(t) for t in page.items], total=page.total, limit=limit, offset=offset)


@router.get("/studies/{name}/pareto", response_model=ParetoOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def pareto(
    name: StudyName,
    config: SettingsDep,
    x: Annotated[Literal["params", "wall_seconds", "gpu_seconds"], Query(description="the cost axis")] = "params",
) -> ParetoOut:
    """Validation perplexity (bits per character for character-level corpora) vs a cost, one colour per family;
    the non-dominated trials as a figure and as data."""
    return await run_in_threadpool(_pareto, config, name, x)


def _pareto(config: Settings, name: str, x: str) -> ParetoOut:
    require_study(config, name)
    column, title = PARETO_AXES[x]
    unit = study_unit(config.storage_url, name)
    frame = pareto_frame(config.storage_url, name)
    frame["score"] = unit.convert(frame["value"])
    front = frame[non_dominated(frame, column, "score")] if not frame.empty else frame
    figure = pareto_figure(frame, x=column, x_title=title, y="score", y_title=unit.title)
    points = [ParetoPoint(trial_id=row.trial_id, family=row.family, number=row.number, x=getattr(row, column),
                          perplexity=row.perplexity, score=row.score) for row in front.sort_values(column).itertuples()]
    return ParetoOut(x=x, figure=figure_json(figure), non_dominated=points)


@router.get("/studies/{name}/comparison", response_model=ComparisonOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def compare(name: StudyName, config: SettingsDep) -> ComparisonOut:
    """The families side by side (Table 2.1 of the paper): the best tuning run, then validation and test
    with and without Monte-Carlo dropout and dynamic evaluation as mean ± std over the final models (the
    reruns), which stage-2 trial each dynamic result came from, and the winner by the rerun mean."""
    found = await run_in_threadpool(comparison, config.storage_url, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return ComparisonOut.model_validate(asdict(found))


@router.get("/trials/{trial_id}", response_model=TrialDetailOut, tags=["trials"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
def trial(trial_id: TrialId, config: SettingsDep) -> TrialDetailOut:
    """One trial: hyperparameters, size, state (with the failure reason), learning curve, checkpoint, and its
    evaluations (test protocol, dynamic evaluation) with scores in the study's unit."""
    found = get_trial(config.storage_url, trial_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial with id {trial_id}")
    curve = [TurnOut.of(turn) for turn in learning_curve(config.storage_url, trial_id)]
    unit = study_unit(config.storage_url, found.study)
    evaluations = [EvaluationOut(**asdict(e), valid_score=unit.of(e.valid_loss), test_score=unit.of(e.test_loss))
                   for e in trial_evaluations(config.storage_url, trial_id)]
    return TrialDetailOut(**TrialOut.of(found).model_dump(), learning_curve=curve, evaluations=evaluations)


@router.get("/trials/{trial_id}/checkpoint", response_class=FileResponse, tags=["trials"], dependencies=[Reader],
            responses={200: {"content": {"application/octet-stream": {}}}, **NotFound, **Unauthorized,
                       403: {"description": "the stored path leaves the artifact store"}})
def checkpoint(trial_id: TrialId, config: SettingsDep) -> FileResponse:
    """The trial's best checkpoint, streamed (load it with `lm_tuner.trainers.load_checkpoint`)."""
    found = get_trial(config.storage_url, trial_id)
    if found is None or found.checkpoint is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} has no checkpoint")
    path = _inside_artifacts(config.artifact_root, found.checkpoint.path)
    return FileResponse(path, media_type="application/octet-stream",
                        filename=f"{found.study}-{found.family}-{found.number}.pt",
                        headers={"X-Checkpoint-SHA256": found.checkpoint.sha256})


def _submitted_spec(body: bytes) -> tuple[StudySpec, str]:
    """The spec of a request body and its text, or SpecError. Run in the thread pool: however the body is made,
    the event loop keeps answering while it is read."""
    try:
        document = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError([SpecIssue("", "the body must be UTF-8 text")]) from error
    spec = parse_spec(document, source="request body")
    issues = submission_issues(spec)
    if issues:
        raise SpecError(issues, "request body")
    return spec, document


async def _read_limited(request: Request, limit: int) -> bytes:
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


def _inside_artifacts(root: Path, relative: str) -> Path:
    """Resolve a stored path, refusing any that leads outside the artifact store."""
    resolved_root = root.resolve()
    path = (resolved_root / relative).resolve()
    if not path.is_relative_to(resolved_root):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "checkpoint path leaves the artifact store")
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the checkpoint file is missing from the artifact store")
    return path


def _spec_errors(issues: list[SpecIssueOut]) -> JSONResponse:
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
                        content={"detail": [issue.model_dump() for issue in issues]})

