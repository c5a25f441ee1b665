"""The shipped study spaces over REST: list them, read one, and submit one as a study by name (the same spaces
`tuner spaces` lists and `tuner launch --space NAME` runs)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as FastAPIPath
from pydantic import BaseModel, Field

from lm_tuner.api.data_access import DataAccessDep
from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized, Writer
from lm_tuner.api.guard import GUARDED
from lm_tuner.api.params import PRINTABLE
from lm_tuner.api.schemas import SpecErrorsOut, SubmittedOut
from lm_tuner.api.submission import queue_study, spec_errors
from lm_tuner.tuner.spec import SpecError
from lm_tuner.tuner.spec.shipped import ShippedSpace, UnknownSpace, shipped_space, shipped_spaces

SPACE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,99}")
# Checked in _shipped, not by the path's schema: a name that cannot be a space is simply not one (404), and the
# submitting route's 422 stays what it documents, a spec that cannot run here. The schema states only what the
# middleware refuses with a 400 before any route: control characters.
SpaceName = Annotated[str, FastAPIPath(pattern=PRINTABLE, description="a shipped space: mogrifier_ptb, "
                                                                      "small/mogrifier_ptb (.yaml optional)")]
NoSuchSpace = {404: {"description": "no shipped space of this name; the message lists them"}}

router = APIRouter(tags=["spaces"])


class SpaceOut(BaseModel):
    name: str = Field(description="what `--space` and POST /spaces/{name}/studies accept")
    description: str


class SpaceDetailOut(SpaceOut):
    text: str = Field(description="the space's YAML, as `tuner spaces show` prints it")


@router.get("/spaces", response_model=list[SpaceOut], dependencies=[Reader], responses=Unauthorized)
def spaces() -> list[SpaceOut]:
    """The study spaces shipped with lm-tuner: full-size first, then their CPU-sized twins under small/."""
    return [SpaceOut(name=space.name, description=space.description) for space in shipped_spaces()]


@router.get("/spaces/{name:path}", response_model=SpaceDetailOut, dependencies=[Reader],
            responses={**NoSuchSpace, **Unauthorized})
def space(name: SpaceName) -> SpaceDetailOut:
    found = _shipped(name)
    return SpaceDetailOut(name=found.name, description=found.description, text=found.text)


@router.post("/spaces/{name:path}/studies", response_model=SubmittedOut, status_code=status.HTTP_202_ACCEPTED,
             dependencies=[Writer],
             responses={**NoSuchSpace, 409: {"description": "a study with this name exists"},
                        422: {"model": SpecErrorsOut, "description": "the space cannot run on this server"},
                        **GUARDED, **Unauthorized})
async def submit_space(name: SpaceName, config: SettingsDep, access: DataAccessDep) -> SubmittedOut:
    """Queue the shipped space `name` as a study, exactly as POST /studies would queue its YAML."""
    found = _shipped(name)
    try:
        return await queue_study(config, found.text.encode(), f"shipped space {found.name}", access)
    except SpecError as error:
        return spec_errors(error)


def _shipped(name: str) -> ShippedSpace:
    try:
        if not SPACE_NAME.fullmatch(name):
            raise UnknownSpace(f"no shipped space {name[:100]!r}; `GET /spaces` lists them")
        return shipped_space(name)
    except UnknownSpace as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from error
