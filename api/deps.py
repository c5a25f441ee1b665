"""Request dependencies shared by the API routes and the dashboard pages."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from tuner.results import StudyView, get_study
from tuner.settings import Settings


def settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(settings)]


def study_or_404(config: Settings, name: str) -> StudyView:
    found = get_study(config.storage_url, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return found
