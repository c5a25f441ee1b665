"""Measured sensitivity over REST: queue the runs (a `tuner worker` trains them) and read the measured effect."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status
from fastapi.exceptions import RequestValidationError

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized, Writer, study_or_404
from lm_tuner.api.guard import GUARDED
from lm_tuner.api.params import StudyName, text_query
from lm_tuner.api.schemas import EffectPoint, SensitivityIn, SensitivityOut, SensitivityPlanOut
from lm_tuner.dashboards import figure_json, sensitivity_figure
from lm_tuner.tuner.analysis.sensitivity import measured_effect, pending_runs, sensitivity_runs
from lm_tuner.tuner.run.sensitivity import SensitivityError, plan_sensitivity
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import distributions
from lm_tuner.tuner.spec.units import unit_of
from lm_tuner.tuner.store import Storage, top_trials

router = APIRouter(tags=["sensitivity"])


@router.post("/studies/{name}/sensitivity", response_model=SensitivityPlanOut, status_code=status.HTTP_202_ACCEPTED,
             dependencies=[Writer], responses={
                 404: {"description": "no such study"}, **Unauthorized, **GUARDED,
                 400: {"description": "the body is not valid JSON, the Host header is not a name this server answers "
                                      "to, or the URL holds a control character"}})
def request_sensitivity(name: StudyName, body: SensitivityIn, config: SettingsDep) -> SensitivityPlanOut:
    """Queue re-runs of the best configuration with `parameter` moved across ±15% of its range (`points`
    values, `seeds` seeds each); a `tuner worker` (or `tuner serve`) trains them. Runs already queued or
    made are not repeated. The runs' checkpoints go to the artifact store the study ran with, whichever the
    service and the worker were given."""
    study_or_404(config, name)
    try:
        plan = plan_sensitivity(config.storage_url, name, body.parameter, seeds=body.seeds, points=body.points,
                                family=body.family)
    except SensitivityError as error:  # answered like FastAPI's own validation errors, naming the field
        raise RequestValidationError([{"type": "value_error", "loc": ("body", error.field), "msg": str(error),
                                       "input": getattr(body, error.field, None)}]) from error
    return SensitivityPlanOut(study=name, family=plan.family, parameter=plan.parameter,
                              best_trial_id=plan.best_trial_id, best_value=plan.best_value, values=plan.values,
                              seeds=plan.seeds, queued=plan.queued, page=f"/dashboard/studies/{name}/sensitivity"
                                                                        f"?parameter={plan.parameter}")


@router.get("/studies/{name}/sensitivity", response_model=SensitivityOut, dependencies=[Reader],
            responses={404: {"description": "no such study"}, **Unauthorized})
def read_sensitivity(
    name: StudyName,
    config: SettingsDep,
    parameter: Annotated[str, text_query(64, "the hyperparameter that was moved")],
) -> SensitivityOut:
    """The measured effect: per family and moved value, mean ± std of the validation score over seeds, with
    the figure; `pending` counts runs still queued or running."""
    study = study_or_404(config, name)
    spec = StudySpec.model_validate(study.spec)
    unit = unit_of(study.spec)
    runs = sensitivity_runs(config.storage_url, name, parameter)
    effect = measured_effect(runs)
    best_values, log = {}, False
    for family in spec.families:
        space = distributions(spec, family)
        best = top_trials(config.storage_url, name, family, "tune", 1)
        if parameter in space and best:
            best_values[family] = Storage(config.storage_url).optuna().get_trial(best[0].trial_id).params[parameter]
            log = log or bool(getattr(space[parameter], "log", False))
    shown = effect["family"].iloc[0] if not effect.empty else None
    figure = sensitivity_figure(runs, effect, parameter, unit.title, best_values.get(shown), log)
    return SensitivityOut(
        parameter=parameter, unit=unit.name, best_values=best_values,
        pending=pending_runs(config.storage_url, name, runs),
        effect=[EffectPoint(family=r.family, value=r.value, mean=r.mean, std=r.std, count=r.count)
                for r in effect.itertuples()],
        figure=figure_json(figure))
