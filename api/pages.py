"""The dashboard's HTML pages, served beside the REST API."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from api.deps import SettingsDep, study_or_404
from api.schemas import StudyOut
from dashboards import plotly_js_path, studies_page, study_page
from tuner.results import list_studies, study_trials

router = APIRouter(include_in_schema=False)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=HTMLResponse)
def studies(config: SettingsDep) -> str:
    return studies_page([StudyOut.of(s).model_dump() for s in list_studies(config.storage_url)])


@router.get("/dashboard/studies/{name}", response_class=HTMLResponse)
def study(name: str, config: SettingsDep) -> str:
    found = study_or_404(config, name)
    trials = [{**asdict(t), "perplexity": t.perplexity, "has_checkpoint": t.checkpoint is not None}
              for t in study_trials(config.storage_url, name)]
    return study_page(StudyOut.of(found).model_dump(), trials)


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    path = plotly_js_path()
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "plotly.js is missing from the plotly package")
    return FileResponse(path, media_type="text/javascript")
