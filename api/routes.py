"""REST endpoints of studies: list, detail, cancel, resume, delete, their trials, Pareto front and comparison."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response, status
from starlette.concurrency import run_in_threadpool

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized, Writer, require_study, study_or_404
from lm_tuner.api.guard import GUARDED
from lm_tuner.api.params import Limit, Offset, StudyName, text_query
from lm_tuner.api.schemas import (
    ComparisonOut,
    ParetoOut,
    ParetoPoint,
    StatusOut,
    StudyPage,
    TrialPage,
)
from lm_tuner.dashboards import figure_json, non_dominated, pareto_figure
from lm_tuner.tuner.analysis.comparison import comparison, comparison_document
from lm_tuner.tuner.analysis.study_facts import study_baseline
from lm_tuner.tuner.analysis.study_frames import study_unit
from lm_tuner.tuner.analysis.trial_frames import pareto_frame
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store import (
    BaselineOut,
    Page,
    Storage,
    StudyDetailOut,
    StudyOut,
    StudyStateError,
    StudyView,
    TrialOut,
    TrialView,
)

PARETO_AXES = {
    "compute": ("compute_seconds", "compute ({compute_unit})"),  # the trial's CPU core-seconds or GPU-seconds
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
    page = await run_in_threadpool(Storage(config.storage_url).studies, status=status_filter, family=family,
                                   name_contains=q, limit=limit, offset=offset)
    return StudyPage(items=[StudyOut.of(s) for s in page.items], total=page.total, limit=limit, offset=offset)


@router.get("/studies/{name}", response_model=StudyDetailOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def study(name: StudyName, config: SettingsDep) -> StudyDetailOut:
    """Status, trial counts by state, progress and ETA, the best trial, the spec as submitted, what its run warned
    about and the unigram baseline of its corpus."""
    return await run_in_threadpool(_study_detail, config, name)


def _study_detail(config: Settings, name: str) -> StudyDetailOut:
    found = study_or_404(config, name)
    return StudyDetailOut.of(found, baseline_of(found))


def baseline_of(study: StudyView) -> BaselineOut:
    """The unigram baseline of a study's corpus: stored, else read here (a registered dataset only if downloaded)."""
    return BaselineOut(**asdict(study_baseline(study)))


@router.post("/studies/{name}/cancel", response_model=StatusOut, status_code=status.HTTP_202_ACCEPTED,
             tags=["studies"], dependencies=[Writer],
             responses={**NotFound, **Unauthorized, **GUARDED, 409: {"description": "the study has already ended"}})
def cancel(name: StudyName, config: SettingsDep) -> StatusOut:
    """Cancel a queued study at once, or a running one within seconds (its running trials stop)."""
    try:
        return StatusOut(name=name, status=Storage(config.storage_url).cancel(name))
    except KeyError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}") from error
    except StudyStateError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error


@router.post("/studies/{name}/resume", response_model=StatusOut, status_code=status.HTTP_202_ACCEPTED,
             tags=["studies"], dependencies=[Writer],
             responses={**NotFound, **Unauthorized, **GUARDED,
                        409: {"description": "the study is queued, running or complete"}})
def resume(name: StudyName, config: SettingsDep) -> StatusOut:
    """Put a failed or cancelled study back in the queue; the server's worker continues it as `tuner resume`
    would (finished trials are kept, interrupted ones run again)."""
    try:
        return StatusOut(name=name, status=Storage(config.storage_url).resume(name))
    except KeyError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}") from error
    except StudyStateError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error


@router.delete("/studies/{name}", status_code=status.HTTP_204_NO_CONTENT, tags=["studies"], dependencies=[Writer],
               responses={**NotFound, **Unauthorized, **GUARDED, 409: {"description": "the study is still running"},
                          500: {"description": "its checkpoint files could not be removed: the study is kept"}})
def remove(name: StudyName, config: SettingsDep) -> Response:
    """Delete a study that is not running: its trials, learning curves and checkpoint files (the files first: where
    they cannot be removed, the study is kept, to be deleted again)."""
    try:
        storage = Storage(config.storage_url)
        storage.delete(name, storage.artifact_root(name) or config.artifact_root)  # where the study wrote them
    except KeyError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}") from error
    except StudyStateError as error:
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from error
    except OSError as error:
        raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR,
                            f"the study's checkpoint files could not be removed ({error}); the study is kept: delete "
                            f"it again once the artifact store allows it") from error
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
        return Storage(config.storage_url).trials(name, state=state, family=family, stage=stage, sort=sort,
                            descending=order == "desc", limit=limit, offset=offset)

    page = await run_in_threadpool(page_of_trials)
    return TrialPage(items=[TrialOut.of(t) for t in page.items], total=page.total, limit=limit, offset=offset)


@router.get("/studies/{name}/pareto", response_model=ParetoOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def pareto(
    name: StudyName,
    config: SettingsDep,
    x: Annotated[Literal["compute", "params", "wall_seconds", "gpu_seconds"],
                 Query(description="the cost axis: compute (CPU core-seconds or GPU-seconds, as the trials ran), "
                                   "trainable parameters, training wall time or GPU time reserved")] = "compute",
) -> ParetoOut:
    """Validation perplexity (bits per character for character-level corpora) vs a cost, one colour per family;
    the non-dominated trials as a figure and as data. Trials without the cost recorded (compute before the compute
    account was kept) are left out."""
    return await run_in_threadpool(_pareto, config, name, x)


def _pareto(config: Settings, name: str, x: str) -> ParetoOut:
    require_study(config, name)
    column, title = PARETO_AXES[x]
    unit = study_unit(config.storage_url, name)
    frame = pareto_frame(config.storage_url, name)
    title = title.format(compute_unit=frame.attrs["compute_unit"])
    frame["score"] = unit.convert(frame["value"])
    costed = frame.dropna(subset=[column])
    front = costed[non_dominated(costed, column, "score")] if not costed.empty else costed
    figure = pareto_figure(frame, x=column, x_title=title, y="score", y_title=unit.title)
    points = [ParetoPoint(trial_id=row.trial_id, family=row.family, number=row.number, x=getattr(row, column),
                          perplexity=row.perplexity, score=row.score) for row in front.sort_values(column).itertuples()]
    return ParetoOut(x=x, figure=figure_json(figure), non_dominated=points)


@router.get("/studies/{name}/comparison", response_model=ComparisonOut, tags=["studies"], dependencies=[Reader],
            responses={**NotFound, **Unauthorized})
async def compare(name: StudyName, config: SettingsDep) -> ComparisonOut:
    """The families side by side (Table 2.1 of the paper): the best tuning run, then validation and test
    with and without Monte-Carlo dropout and dynamic evaluation as mean ± std over the final models (the
    reruns), which stage-2 trial each dynamic result came from, each family's tuning at equal training tokens
    and at equal compute with the winner at each, the winner by the rerun mean (only where the seeds separate
    it) with the budget it holds under, and the unigram baseline of the corpus."""
    return await run_in_threadpool(_comparison, config, name)


def _comparison(config: Settings, name: str) -> ComparisonOut:
    found = comparison(config.storage_url, name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return ComparisonOut.model_validate(comparison_document(found, study_baseline(study_or_404(config, name))))
