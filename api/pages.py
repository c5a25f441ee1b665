"""The dashboard's HTML pages and the fragments they refresh in place while a study runs."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from optuna.distributions import CategoricalDistribution

from lm_tuner.api.csrf import page_token
from lm_tuner.api.deps import SESSION_COOKIE, Reader, SettingsDep, study_or_404
from lm_tuner.api.params import Offset, StudyName, TrialId, text_query
from lm_tuner.dashboards import render, static_path
from lm_tuner.tuner.analysis.budget_sentences import amount, quantity
from lm_tuner.tuner.analysis.comparison import Comparison, comparison
from lm_tuner.tuner.analysis.sensitivity import measured_effect, pending_runs, sensitivity_runs
from lm_tuner.tuner.analysis.study_facts import Baseline, baseline_warning, study_baseline
from lm_tuner.tuner.analysis.study_frames import EVALUATORS, study_unit, trial_evaluations
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.priors import prior_line, stored_study_priors
from lm_tuner.tuner.spec.shipped import shipped_spaces
from lm_tuner.tuner.spec.space import distributions
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store import STUDY_STATUSES, TRIAL_STATES, Storage, StudyOut, StudyView, TrialOut

router = APIRouter(include_in_schema=False)

STUDIES_PAGE = 50
TRIALS_PAGE = 100
STAGES = ("tune", "rerun", "dyneval", "sensitivity")
DEFAULT_EVALUATOR = "ped_anova"  # fANOVA takes minutes at thousands of trials; the page offers it
Html = {"response_class": HTMLResponse, "dependencies": [Reader]}
Refresh = Annotated[float, Query(ge=0.2, le=3600, description="seconds between live refreshes")]
StatusFilter = Annotated[Literal["", *STUDY_STATUSES] | None, Query()]
STATIC_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}(/[A-Za-z0-9_.-]{1,100}){0,4}")  # what dashboards/static holds


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", **Html)
def studies(request: Request, config: SettingsDep, refresh: Refresh = 5.0) -> str:
    """Every study and comparison: status, progress, best score, families, budget; filters."""
    families = Storage(config.storage_url).families()
    return render("studies.html", **_studies(config, None, None, None, 0), statuses=STUDY_STATUSES,
                  families=families, refresh_ms=int(refresh * 1000), csrf_token=page_token(request))


@router.get("/dashboard/fragments/studies", **Html)
def studies_fragment(config: SettingsDep, status_filter: Annotated[StatusFilter, Query(alias="status")] = None,
                     family: Annotated[str | None, text_query(32)] = None,
                     q: Annotated[str | None, text_query(64)] = None, offset: Offset = 0) -> str:
    return render("_studies.html", **_studies(config, status_filter or None, family or None, q or None, offset))


@router.get("/dashboard/studies/new", **Html)  # before /dashboard/studies/{name}; specs refuse the name "new"
def new_study(request: Request, config: SettingsDep, space: Annotated[str, text_query(100)] = "quickstart") -> str:
    """A YAML editor prefilled from a shipped space, checked as it is typed; plan it, then submit it."""
    return render("new_study.html", spaces=shipped_spaces(), space=space, may_write=_may_write(request, config),
                  refresh_ms=0, csrf_token=page_token(request))


@router.get("/dashboard/studies/{name}", **Html)
def study(request: Request, name: StudyName, config: SettingsDep, refresh: Refresh = 5.0) -> str:
    """Optimisation history, Pareto front, learning curves, parallel coordinates, importance, trial table."""
    found = study_or_404(config, name)
    return render("study.html", study=_study(found), **_trials(config, name, None, None, None, "value", "asc", 0),
                  states=TRIAL_STATES, stages=STAGES, evaluators=list(EVALUATORS), evaluator=DEFAULT_EVALUATOR,
                  may_write=_may_write(request, config), refresh_ms=int(refresh * 1000), csrf_token=page_token(request))


@router.get("/dashboard/fragments/studies/{name}/facts", **Html)
def study_facts(name: StudyName, config: SettingsDep) -> str:
    return render("_study_facts.html", study=_study(study_or_404(config, name)))


@router.get("/dashboard/fragments/studies/{name}/trials", **Html)
def trials_fragment(
    name: StudyName,
    config: SettingsDep,
    state: Annotated[Literal["", *TRIAL_STATES] | None, Query()] = None,
    family: Annotated[str | None, text_query(32)] = None,
    stage: Annotated[Literal["", *STAGES] | None, Query()] = None,
    sort: Annotated[Literal["number", "value", "family", "state", "started"], Query()] = "value",
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    offset: Offset = 0,
) -> str:
    """One page of the trial table, sorted and filtered in the database."""
    study_or_404(config, name)
    return render("_trials.html", **_trials(config, name, state or None, family or None, stage or None, sort, order,
                                            offset))


@router.get("/dashboard/studies/{name}/comparison", **Html)
def comparison_page(request: Request, name: StudyName, config: SettingsDep, refresh: Refresh = 5.0) -> str:
    """Table 2.1: the families side by side, a Pareto plot across them, and the stage-2 lineage."""
    return render("comparison.html", **_comparison(config, name), refresh_ms=int(refresh * 1000),
                  csrf_token=page_token(request))


@router.get("/dashboard/fragments/studies/{name}/comparison", **Html)
def comparison_fragment(name: StudyName, config: SettingsDep) -> str:
    return render("_comparison.html", **_comparison(config, name))


@router.get("/dashboard/trials/{trial_id}", **Html)
def trial(request: Request, trial_id: TrialId, config: SettingsDep, refresh: Refresh = 5.0) -> str:
    """Hyperparameters, learning curve, evaluation results and the checkpoint of one trial."""
    return render("trial.html", **_trial(config, trial_id), refresh_ms=int(refresh * 1000),
                  csrf_token=page_token(request))


@router.get("/dashboard/fragments/trials/{trial_id}", **Html)
def trial_fragment(trial_id: TrialId, config: SettingsDep) -> str:
    return render("_trial.html", **_trial(config, trial_id))


@router.get("/dashboard/studies/{name}/sensitivity", **Html)
def sensitivity_page(request: Request, name: StudyName, config: SettingsDep,
                     parameter: Annotated[str | None, text_query(64)] = None, refresh: Refresh = 5.0) -> str:
    """The measured effect of one hyperparameter, with a form that queues more runs."""
    found = study_or_404(config, name)
    spec = StudySpec.model_validate(found.spec)
    parameters = sorted({p for family in spec.families for p, d in distributions(spec, family).items()
                         if not d.single() and not isinstance(d, CategoricalDistribution)})
    chosen = parameter or _measured_parameter(config, name, parameters)
    return render("sensitivity.html", study=_study(found), parameters=parameters, parameter=chosen,
                  **_sensitivity(config, name, chosen), may_write=_may_write(request, config),
                  refresh_ms=int(refresh * 1000), csrf_token=page_token(request))


@router.get("/dashboard/fragments/studies/{name}/sensitivity", **Html)
def sensitivity_fragment(name: StudyName, config: SettingsDep, parameter: Annotated[str, text_query(64)]) -> str:
    study_or_404(config, name)
    return render("_sensitivity.html", parameter=parameter, **_sensitivity(config, name, parameter))


@router.get("/static/{filename:path}")
def static(filename: str) -> FileResponse:
    path = static_path(filename) if STATIC_NAME.fullmatch(filename) else None  # names no file has: not looked up
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {filename!r}")
    # Vendored files carry their version in their name: browsers may keep them for good.
    headers = {"Cache-Control": "public, max-age=31536000, immutable"} if filename.startswith("vendor/") else None
    return FileResponse(path, media_type="text/javascript" if path.suffix == ".js" else None, headers=headers)


def _may_write(request: Request, config: Settings) -> bool:
    """Whether this visitor may submit, cancel, resume or queue runs: authentication is off, or the browser is signed
    in with a valid token. Pages disable those actions, and say why, for anyone else."""
    storage = Storage(config.storage_url)
    return not storage.auth_enabled() or storage.token_is_valid(request.cookies.get(SESSION_COOKIE) or "")


def _study(found: StudyView, baseline: Baseline | None = None) -> dict[str, Any]:
    """The study as the pages show it; `baseline`, where the caller has it already (read from the corpus, it can
    take seconds), else its own."""
    unit = unit_of(found.spec)
    best = None if found.best is None else unit.of(found.best.value)
    baseline = baseline or study_baseline(found)
    return {**StudyOut.of(found).model_dump(), "unit": unit.name, "unit_title": unit.title, "best_score": best,
            "best_possible_score": unit.of(found.best_possible_loss), "warnings": found.warnings,
            "unigram_score": unit.of(baseline.loss), "unigram_unknown_because": baseline.unknown_because,
            "priors": [prior_line(prior) for prior in stored_study_priors(found.spec)]}


def _studies(config: Settings, status_filter: str | None, family: str | None, q: str | None,
             offset: int) -> dict[str, Any]:
    page = Storage(config.storage_url).studies(status=status_filter, family=family, name_contains=q, limit=STUDIES_PAGE,
                        offset=offset)
    query = urlencode({k: v for k, v in (("status", status_filter), ("family", family), ("q", q)) if v})
    return {"studies": [_study(s) for s in page.items], "total": page.total, "offset": offset,
            "limit": STUDIES_PAGE, "query": query}


def _trials(config: Settings, name: str, state: str | None, family: str | None, stage: str | None, sort: str,
            order: str, offset: int) -> dict[str, Any]:
    unit = _unit(config, name)
    page = Storage(config.storage_url).trials(name, state=state, family=family, stage=stage, sort=sort,
                        descending=order == "desc", limit=TRIALS_PAGE, offset=offset)
    rows = [{**asdict(t), "score": unit.of(t.value), "has_checkpoint": t.checkpoint is not None} for t in page.items]
    filters = urlencode({k: v for k, v in (("state", state), ("family", family), ("stage", stage)) if v})
    return {"trials": rows, "total": page.total, "offset": offset, "limit": TRIALS_PAGE, "sort": sort,
            "order": order, "filters": filters, "unit": unit.name}


def _comparison(config: Settings, name: str) -> dict[str, Any]:
    found, compared = study_or_404(config, name), comparison(config.storage_url, name)
    margin = compared.margin.sentence(compared.unit) if compared.margin else None
    baseline = study_baseline(found)
    return {"study": _study(found, baseline), "comparison": asdict(compared), "margin": margin,
            "baseline_warning": baseline_warning(compared.no_better_than(baseline)), "budget": _budget(compared)}


def _budget(compared: Comparison) -> dict[str, Any]:
    """The comparison's spends as a reader reads them: 1.20M tokens, 2,400 CPU core-seconds, or unknown."""
    unit = compared.compute_unit
    return {"equal_tokens": amount("tokens", compared.equal_tokens, unit),
            "equal_compute": amount("compute", compared.equal_compute_seconds, unit),
            "families": {row.family: {"tokens": quantity("tokens", row.tokens),
                                      "compute": quantity("compute", row.compute_seconds)}
                         for row in compared.families}}


def _trial(config: Settings, trial_id: int) -> dict[str, Any]:
    found = Storage(config.storage_url).trial(trial_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial with id {trial_id}")
    spec = study_or_404(config, found.study).spec
    unit = unit_of(spec)
    evaluations = [{**asdict(e), "valid_score": unit.of(e.valid_loss), "test_score": unit.of(e.test_loss)}
                   for e in trial_evaluations(config.storage_url, trial_id)]
    return {"trial": {**TrialOut.of(found).model_dump(), "score": unit.of(found.value)}, "unit": unit.name,
            "evaluations": evaluations, "test_protocol": spec.get("evaluation") is not None,
            "reruns": spec.get("reruns") is not None}


def _sensitivity(config: Settings, name: str, parameter: str | None) -> dict[str, Any]:
    runs = sensitivity_runs(config.storage_url, name, parameter or "")
    effect = measured_effect(runs).to_dict("records")
    return {"effect": effect, "pending": pending_runs(config.storage_url, name, runs)}


def _measured_parameter(config: Settings, name: str, parameters: list[str]) -> str | None:
    """The first hyperparameter with measured runs, else the first searched one."""
    measured = [p for p in parameters if not sensitivity_runs(config.storage_url, name, p).empty]
    return (measured or parameters or [None])[0]


def _unit(config: Settings, name: str) -> Unit:
    return study_unit(config.storage_url, name)
