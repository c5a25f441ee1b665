"""REST endpoints: studies, trials, the Pareto figure and checkpoint downloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse, JSONResponse

from api.deps import SettingsDep, study_or_404
from api.schemas import SpecIssueOut, StudyDetailOut, StudyOut, SubmittedOut, TrialDetailOut, TrialOut, TurnOut
from dashboards import pareto_figure
from tuner.controller import StudyConflict
from tuner.queue import submit_study
from tuner.results import get_trial, learning_curve, list_studies, study_trials, trials_frame
from tuner.spec import SpecError, parse_spec

MAX_SPEC_BYTES = 256 * 1024

router = APIRouter()


@router.get("/health", tags=["service"])
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/studies", response_model=list[StudyOut], tags=["studies"])
def studies(config: SettingsDep) -> list[StudyOut]:
    return [StudyOut.of(study) for study in list_studies(config.storage_url)]


@router.post(
    "/studies",
    response_model=SubmittedOut,
    status_code=status.HTTP_202_ACCEPTED,
    tags=["studies"],
    responses={422: {"model": list[SpecIssueOut], "description": "the spec is invalid; one entry per problem"},
               409: {"description": "a study with this name exists"}},
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/yaml": {"schema": {"type": "string"}},
        "application/json": {"schema": {"type": "object"}},
    }}},
)
async def submit(request: Request, config: SettingsDep) -> Any:
    """Queue a study. The body is the same YAML (or JSON) document `tuner launch --space` reads."""
    body = await request.body()
    if len(body) > MAX_SPEC_BYTES:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"a spec may be at most {MAX_SPEC_BYTES} bytes")
    try:
        document = body.decode("utf-8")
        spec = parse_spec(document, source="request body")
    except UnicodeDecodeError:
        return _spec_errors([SpecIssueOut(field="", message="the body must be UTF-8 text", line=None)])
    except SpecError as error:
        return _spec_errors([SpecIssueOut(field=i.field, message=i.message, line=i.line) for i in error.issues])
    try:
        submit_study(config.storage_url, spec, document)
    except StudyConflict as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    return SubmittedOut(name=spec.name, status="queued", url=f"/studies/{spec.name}")


@router.get("/studies/{name}", response_model=StudyDetailOut, tags=["studies"])
def study(name: str, config: SettingsDep) -> StudyDetailOut:
    return StudyDetailOut.of(study_or_404(config, name))


@router.get("/studies/{name}/trials", response_model=list[TrialOut], tags=["studies"])
def trials(name: str, config: SettingsDep) -> list[TrialOut]:
    study_or_404(config, name)
    return [TrialOut.of(trial) for trial in study_trials(config.storage_url, name)]


@router.get("/studies/{name}/pareto", tags=["studies"])
def pareto(name: str, config: SettingsDep) -> dict[str, Any]:
    """A plotly figure (JSON): validation perplexity vs trainable parameters, one colour per family."""
    study_or_404(config, name)
    frame = trials_frame(study_trials(config.storage_url, name))
    return json.loads(pareto_figure(frame).to_json())


@router.get("/trials/{trial_id}", response_model=TrialDetailOut, tags=["trials"])
def trial(trial_id: int, config: SettingsDep) -> TrialDetailOut:
    found = get_trial(config.storage_url, trial_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial with id {trial_id}")
    curve = [TurnOut.of(turn) for turn in learning_curve(config.storage_url, trial_id)]
    return TrialDetailOut(**TrialOut.of(found).model_dump(), learning_curve=curve)


@router.get("/trials/{trial_id}/checkpoint", response_class=FileResponse, tags=["trials"],
            responses={200: {"content": {"application/octet-stream": {}}}})
def checkpoint(trial_id: int, config: SettingsDep) -> FileResponse:
    """The trial's best checkpoint (load it with `trainers.load_checkpoint`)."""
    found = get_trial(config.storage_url, trial_id)
    if found is None or found.checkpoint is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} has no checkpoint")
    path = _inside_artifacts(config.artifact_root, found.checkpoint.path)
    return FileResponse(path, media_type="application/octet-stream",
                        filename=f"{found.study}-{found.family}-{found.number}.pt",
                        headers={"X-Checkpoint-SHA256": found.checkpoint.sha256})


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
