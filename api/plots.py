"""Plot endpoints: each answers one dashboard figure as plotly JSON, aggregated in the database, plus the
numbers it shows as data (so scripts and tests need not parse figures)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from optuna.distributions import BaseDistribution, CategoricalDistribution
from pydantic import Field

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized, require_study, study_or_404
from lm_tuner.api.params import StudyName, text_query
from lm_tuner.api.schemas import (
    BudgetCurvesOut,
    BudgetFamilyOut,
    CurvesOut,
    HistoryBest,
    HistoryOut,
    ImportanceOut,
    ParallelOut,
)
from lm_tuner.dashboards import (
    Range,
    averaging_switches,
    budget_curves_figure,
    curves_figure,
    figure_json,
    history_figure,
    importance_figure,
    neighbourhood,
    parallel_figure,
)
from lm_tuner.tuner.analysis.compute_account import study_account
from lm_tuner.tuner.analysis.study_frames import (
    MAX_CURVES,
    Evaluator,
    budget_frame,
    curves_frame,
    default_curve_trial_ids,
    history_frame,
    importances,
    parameter_table,
    study_unit,
    trials_in_study,
)

router = APIRouter(tags=["plots"], dependencies=[Reader])
NotFound = {404: {"description": "no such study, or no such family in it"}, **Unauthorized}


@router.get("/studies/{name}/history", response_model=HistoryOut, responses=NotFound)
def history(name: StudyName, config: SettingsDep) -> HistoryOut:
    """Every tuning trial's score in order (pruned at their last score, failed marked), the best so far per
    family as a step line."""
    require_study(config, name)
    frame = history_frame(config.storage_url, name)
    unit = study_unit(config.storage_url, name)
    best = {}
    for family, group in frame.dropna(subset=["score"]).groupby("family"):
        row = group.loc[group["score"].idxmin()]
        best[family] = HistoryBest(trial_id=int(row["trial_id"]), number=int(row["number"]), score=row["score"])
    counts = {state: int(count) for state, count in frame["state"].value_counts().items()}
    return HistoryOut(unit=unit.name, figure=figure_json(history_figure(frame, unit.title)), best=best,
                      counts=counts)


@router.get("/studies/{name}/budget-curves", response_model=BudgetCurvesOut, responses=NotFound)
def budget_curves(name: StudyName, config: SettingsDep) -> BudgetCurvesOut:
    """Each family's best validation score so far against the training tokens and the device-seconds (CPU
    core-seconds or GPU-seconds) its tuning trials have spent, in the order their turns were recorded, with the
    equal points (the least any family spent) marked and each family's tokens per device-second."""
    account = study_account(config.storage_url, name)
    if account is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    unit = study_unit(config.storage_url, name)
    rates = {family.family: family.tokens_per_second for family in account.families}
    figure = budget_curves_figure(budget_frame(account, unit), families=[f.family for f in account.families],
                                  rates=rates, equal_tokens=account.tokens.point, equal_compute=account.compute.point,
                                  compute_unit=account.compute_unit, y_title=unit.title)
    families = [BudgetFamilyOut(
        family=family.family, tokens=None if family.total("tokens") is None else int(family.total("tokens")),
        compute_seconds=family.total("compute"), tokens_per_second=family.tokens_per_second,
        best_at_equal_tokens=unit.of(account.tokens.best.get(family.family)),
        best_at_equal_compute=unit.of(account.compute.best.get(family.family))) for family in account.families]
    return BudgetCurvesOut(unit=unit.name, compute_unit=account.compute_unit,
                           equal_tokens=None if account.tokens.point is None else int(account.tokens.point),
                           equal_compute_seconds=account.compute.point, families=families,
                           figure=figure_json(figure))


@router.get("/studies/{name}/curves", response_model=CurvesOut, responses=NotFound)
def curves(
    name: StudyName,
    config: SettingsDep,
    trial_id: Annotated[list[Annotated[int, Field(ge=1, le=2**31 - 1)]] | None, Query(max_length=MAX_CURVES,
                                                description="trials to draw; default: the best five complete "
                                                            "tuning trials and the running ones")] = None,
) -> CurvesOut:
    """Learning curves (validation solid, training dotted) with the turns where averaging switched."""
    require_study(config, name)
    unit = study_unit(config.storage_url, name)
    chosen = trial_id or default_curve_trial_ids(config.storage_url, name)
    if foreign := set(chosen) - trials_in_study(config.storage_url, name, chosen):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"trial(s) {sorted(foreign)} are not in study {name!r}")
    frame = curves_frame(config.storage_url, chosen, unit)
    switches = {int(t): averaging_switches(curve) for t, curve in frame.groupby("trial_id", sort=False)}
    return CurvesOut(unit=unit.name, trial_ids=list(switches), averaging_switches=switches,
                     figure=figure_json(curves_figure(frame, unit.title)))


@router.get("/studies/{name}/parallel", response_model=ParallelOut, responses=NotFound)
def parallel(
    name: StudyName,
    config: SettingsDep,
    family: Annotated[str | None, text_query(32, "default: the study's best family")] = None,
) -> ParallelOut:
    """Parallel coordinates of one family's complete trials; the best trial and its ±15% neighbourhood
    highlighted."""
    study = study_or_404(config, name)
    family = family or (study.best.family if study.best else study.families[0])
    if family not in study.families:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"family {family!r} is not in study {name!r}; it compares {', '.join(study.families)}")
    table = parameter_table(config.storage_url, name, family)
    ranges = {param: _range(d) for param, d in table.distributions.items() if not d.single()}
    frame = table.frame
    best_id = None if frame.empty else int(frame.loc[frame["score"].idxmin(), "trial_id"])
    near = [] if best_id is None else sorted(int(t) for t in frame.loc[neighbourhood(frame, ranges, best_id),
                                                                       "trial_id"])
    return ParallelOut(family=family, unit=table.unit.name, best_trial_id=best_id, neighbourhood=near,
                       trials=len(frame),
                       figure=figure_json(parallel_figure(frame, ranges, best_id, table.unit.title, family)))


@router.get("/studies/{name}/importance", response_model=ImportanceOut, responses=NotFound)
def importance(
    name: StudyName,
    config: SettingsDep,
    evaluator: Annotated[Evaluator, Query(description="Optuna's importance evaluator")] = "ped_anova",
) -> ImportanceOut:
    """Each family's hyperparameter importance from Optuna's evaluator, over its complete tuning trials.
    PED-ANOVA answers in seconds at thousands of trials; fANOVA and mean decrease impurity fit random
    forests and can take minutes there. Results are cached until another trial completes."""
    study = study_or_404(config, name)
    values = {family: importances(config.storage_url, name, family, evaluator) for family in study.families}
    return ImportanceOut(evaluator=evaluator, importances=values,
                         figure=figure_json(importance_figure(values, evaluator)))


def _range(distribution: BaseDistribution) -> Range:
    if isinstance(distribution, CategoricalDistribution):
        return Range(choices=tuple(distribution.choices))
    return Range(low=distribution.low, high=distribution.high, log=distribution.log)
