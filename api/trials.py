"""REST endpoints of one trial: its detail (learning curve, evaluations) and its best checkpoint."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fastapi import APIRouter, HTTPException, Response, status
from fastapi.responses import FileResponse, StreamingResponse

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized
from lm_tuner.api.params import TrialId
from lm_tuner.api.schemas import (
    EvaluationOut,
    TrialDetailOut,
    TurnOut,
)
from lm_tuner.trainers import artifact_store
from lm_tuner.tuner.analysis.study_frames import study_unit, trial_evaluations
from lm_tuner.tuner.settings import ArtifactRoot
from lm_tuner.tuner.store import Storage, TrialOut

router = APIRouter()
NotFound = {404: {"description": "no such study or trial"}}


@router.get("/trials/{trial_id}", response_model=TrialDetailOut, tags=["trials"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
def trial(trial_id: TrialId, config: SettingsDep) -> TrialDetailOut:
    """One trial: hyperparameters, size, state (with the failure reason), learning curve, checkpoint, and its
    evaluations (test protocol, dynamic evaluation) with scores in the study's unit."""
    found = Storage(config.storage_url).trial(trial_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial with id {trial_id}")
    curve = [TurnOut.of(turn) for turn in Storage(config.storage_url).learning_curve(trial_id)]
    unit = study_unit(config.storage_url, found.study)
    evaluations = [EvaluationOut(**asdict(e), valid_score=unit.of(e.valid_loss), test_score=unit.of(e.test_loss))
                   for e in trial_evaluations(config.storage_url, trial_id)]
    return TrialDetailOut(**TrialOut.of(found).model_dump(), learning_curve=curve, evaluations=evaluations)


@router.get("/trials/{trial_id}/checkpoint", response_class=FileResponse, tags=["trials"], dependencies=[Reader],
            responses={200: {"content": {"application/octet-stream": {}}}, **NotFound, **Unauthorized,
                       403: {"description": "the stored path leaves the artifact store"}})
def checkpoint(trial_id: TrialId, config: SettingsDep) -> Response:
    """The trial's best checkpoint, streamed from the artifact store its study ran with (else the service's), a
    folder or object storage (load it with `lm_tuner.trainers.load_checkpoint`)."""
    storage = Storage(config.storage_url)
    found = storage.trial(trial_id)
    if found is None or found.checkpoint is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id} has no checkpoint")
    root = storage.artifact_root(found.study) or config.artifact_root
    location = _inside_artifacts(root, found.checkpoint.path)
    filename = f"{found.study}-{found.family}-{found.number}.pt"
    headers = {"X-Checkpoint-SHA256": found.checkpoint.sha256}
    if isinstance(location, Path):
        return FileResponse(location, media_type="application/octet-stream", filename=filename, headers=headers)
    return StreamingResponse(artifact_store.chunks(location), media_type="application/octet-stream", headers={
        **headers, "Content-Length": str(artifact_store.size(location)),
        "Content-Disposition": f'attachment; filename="{filename}"'})


def _inside_artifacts(root: ArtifactRoot, relative: str) -> ArtifactRoot:
    """Resolve a stored path, refusing any that leads outside the artifact store (in object storage as on disk:
    `..` is folded before the comparison)."""
    resolved_root = root.resolve()
    path = (resolved_root / relative).resolve()
    if not path.is_relative_to(resolved_root):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "checkpoint path leaves the artifact store")
    if not artifact_store.exists(path):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the checkpoint file is missing from the artifact store")
    return path
