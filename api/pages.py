"""The dashboard's HTML pages, served beside the REST API."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from api.deps import Reader, SettingsDep, study_or_404
from api.schemas import StudyOut
from dashboards import plotly_js_path, studies_page, study_page
from tuner.results import list_studies, study_trials

router = APIRouter(include_in_schema=False)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


PAGE_SIZE = 200


@router.get("/dashboard", response_class=HTMLResponse, dependencies=[Reader])
def studies(config: SettingsDep) -> str:
    page = list_studies(config.storage_url, limit=PAGE_SIZE)
    return studies_page([StudyOut.of(s).model_dump() for s in page.items], total=page.total)


@router.get("/dashboard/studies/{name}", response_class=HTMLResponse, dependencies=[Reader])
def study(name: str, config: SettingsDep) -> str:
    """The study with its best trials first (one page of them; the API pages through the rest)."""
    found = study_or_404(config, name)
    page = study_trials(config.storage_url, name, sort="value", limit=PAGE_SIZE)
    trials = [{**asdict(t), "perplexity": t.perplexity, "has_checkpoint": t.checkpoint is not None}
              for t in page.items]
    return study_page(StudyOut.of(found).model_dump(), trials, total=page.total)


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    path = plotly_js_path()
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "plotly.js is missing from the plotly package")
    return FileResponse(path, media_type="text/javascript")
