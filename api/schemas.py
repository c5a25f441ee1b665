"""Response bodies of the REST API, built from the tuner's read models; studies and trials are the tuner's own
JSON documents (lm_tuner.tuner.store.documents), the same ones the CLI prints."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lm_tuner.tuner.run.sensitivity import POINTS, SEEDS
from lm_tuner.tuner.spec.plan import StudyCost
from lm_tuner.tuner.store import BaselineOut, StudyOut, TrialOut, TurnRecord


class TurnOut(BaseModel):
    turn: int
    step: int
    train_loss: float
    val_loss: float
    best_val_loss: float
    tokens_per_second: float
    wall_seconds: float
    process_seconds: float | None
    averaging_length: int | None
    learning_rate: float | None
    epochs: float | None
    train_seconds: float | None
    eval_seconds: float | None
    val_tokens: int | None = Field(description="validation tokens the turn's val_loss scored")
    val_subset: bool | None = Field(description="val_loss scored a fixed subset of the validation split "
                                                "(training.validation_tokens), not all of it")
    reversed_loss: float | None = Field(None, description="reverse-copy tasks: the loss on the reversed halves of "
                                                          "the scored examples, next to val_loss on every token")
    reversed_accuracy: float | None = Field(None, description="reverse-copy tasks: the share of reversed symbols "
                                                              "predicted (argmax)")
    val_logit_scale: float | None = Field(None, description="val_loss was scored with the logits multiplied by "
                                                            "this (1 / softmax temperature)")
    fine_tuning: bool | None = Field(None, description="a turn of the fine-tuning stage (training.fine_tuning), "
                                                       "after the main training's turns")

    @classmethod
    def of(cls, record: TurnRecord) -> TurnOut:
        return cls(**{name: getattr(record, name) for name in cls.model_fields})


class EvaluationOut(BaseModel):
    kind: str
    valid_loss: float
    test_loss: float
    valid_score: float
    test_score: float
    logit_scale: float
    settings: dict[str, Any]
    dyneval_trial_id: int | None


class TrialDetailOut(TrialOut):
    learning_curve: list[TurnOut]
    evaluations: list[EvaluationOut]


class StudyPage(BaseModel):
    items: list[StudyOut]
    total: int
    limit: int
    offset: int


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int
    limit: int
    offset: int


class ParetoPoint(BaseModel):
    trial_id: int
    family: str
    number: int
    x: float
    perplexity: float
    score: float  # in the study's unit: perplexity, or bits per character


class ParetoOut(BaseModel):
    x: str
    figure: dict[str, Any]
    non_dominated: list[ParetoPoint]


class StatusOut(BaseModel):
    name: str
    status: str


class SubmittedOut(BaseModel):
    name: str
    status: str
    url: str
    warnings: list[str] = Field(default_factory=list, description="what `tuner plan` warns about this study (without "
                                                                  "its time probe); the study is queued all the same")
    cost: StudyCost | None = Field(None, description="what the study needs, in GPU-hours or core-hours and in time on "
                                                     "this server's machine, from a FLOP count (as `tuner launch` "
                                                     "prints it); null where the data's sizes are unknown here")


class SpecIssueOut(BaseModel):
    field: str
    message: str
    line: int | None


class SpecErrorsOut(BaseModel):
    detail: list[SpecIssueOut]


class EstimateOut(BaseModel):
    mean: float
    std: float
    count: int


class LineageOut(BaseModel):
    checkpoint_trial_id: int
    dyneval_trial_id: int | None
    settings: dict[str, Any]


class FamilyResultOut(BaseModel):
    family: str
    complete_tuning_trials: int
    stopped_tuning_trials: int = Field(0, description="tuning trials stopped early: pruned, or left at a lower rung "
                                                      "of a compute budget")
    best_tuning: float | None
    final_trial_ids: list[int]
    valid: EstimateOut | None
    test: EstimateOut | None
    mc_valid: EstimateOut | None
    mc_test: EstimateOut | None
    dynamic_valid: EstimateOut | None
    dynamic_test: EstimateOut | None
    lineage: list[LineageOut]
    best_tuning_full: float | None = Field(description="the best tuning run on the whole validation split, where "
                                                       "turns scored a subset")
    valid_from: str | None = Field(description="where `valid` comes from: test protocol, full rescoring or training")
    reruns_planned: int | None = Field(description="null: the spec asks for no reruns")
    reruns_finished: int | None
    reversed_loss: EstimateOut | None = Field(None, description="reverse-copy tasks: the final models' loss "
                                                               "(nats/token) on the reversed halves; else null")
    reversed_accuracy: EstimateOut | None = Field(None, description="reverse-copy tasks: the final models' share of "
                                                                   "reversed symbols predicted; else null")
    tokens: int | None = Field(None, description="training tokens the family's tuning trials have spent (every turn "
                                                 "so far, whatever the trial's state); null where turns were recorded "
                                                 "without them (before the compute account was kept)")
    compute_seconds: float | None = Field(None, description="device-seconds they have spent, in the comparison's "
                                                            "`compute_unit`; null where unknown")
    tokens_per_second: float | None = Field(None, description="training tokens per device-second (CPU core-second or "
                                                              "GPU-second) over the family's tuning")
    best_at_equal_tokens: float | None = Field(None, description="the best validation score (the tuning score) among "
                                                                 "the family's turns reported within `equal_tokens` "
                                                                 "(+5%); null where unknown")
    best_at_equal_compute: float | None = Field(None, description="the same within `equal_compute_seconds` (+5%)")
    final_tokens: float | None = Field(None, description="training tokens of the final models, mean per model")
    final_compute_seconds: float | None = Field(None, description="device-seconds of the final models, mean per "
                                                                  "model")


class MarginOut(BaseModel):
    runner_up: str
    difference: float = Field(description="the runner-up's mean score less the winner's (lower is better)")
    low: float | None = Field(description="95% interval of the difference, by Welch's t over the two families' "
                                          "seeds; null where none can be drawn (fewer than two seeds of a family, "
                                          "or no spread)")
    high: float | None
    seeds: list[int] = Field(description="the winner's and the runner-up's final models (seeds) the means are over")


class ComparisonOut(BaseModel):
    study: str
    unit: str
    families: list[FamilyResultOut]
    winner: str | None = Field(description="named only once every planned rerun (and evaluation) has finished, "
                                           "where the study compares two families or more, and where the 95% "
                                           "interval of the difference to the runner-up excludes 0 (or none can be "
                                           "drawn: `margin`); without reruns, only where the tuning account's "
                                           "winners at equal tokens and compute agree")
    winner_by: str
    status: str
    provisional: bool = Field(description="the study still runs: every number can change")
    has_reruns: bool
    reruns_planned: int
    reruns_finished: int
    tuning_validation: str = Field(description="which validation set the tuning scores are on")
    verdict: str = Field(description="the winner, the budget it holds under and why, or why there is none (yet)")
    margin: MarginOut | None = Field(None, description="the leading family's margin over the runner-up; null where "
                                                       "there is no leader or no runner-up")
    winner_holds_at: str | None = Field(None, description="the budget the winner was measured at: its final models' "
                                                          "tokens and compute per model (equal within 5% or not), "
                                                          "or the equal budgets of the tuning account")
    compute_unit: str = Field("CPU core-seconds", description="what device-seconds are here: CPU core-seconds or "
                                                              "GPU-seconds")
    equal_tokens: int | None = Field(None, description="the equal-tokens point: the fewest training tokens any "
                                                       "family's tuning has spent; null where unknown")
    equal_compute_seconds: float | None = Field(None, description="the equal-compute point: the fewest "
                                                                  "device-seconds any family's tuning has spent")
    winner_at_equal_tokens: str | None = Field(None, description="the family with the best tuning score at "
                                                                 "`equal_tokens`; null for one family, where unknown, "
                                                                 "or where a family has no score there")
    winner_at_equal_compute: str | None = Field(None, description="the same at `equal_compute_seconds`")
    budget_verdict: str = Field("", description="both budgets in words, and why their winners differ where they do")
    unigram_baseline: BaselineOut = Field(description="the unigram baseline of the corpus: the validation "
                                                      "perplexity of word frequencies alone, for scale")
    no_better_than_baseline: list[str] = Field(description="the families whose validation score (of the final "
                                                           "models, else of the best tuning run) does not beat the "
                                                           "unigram baseline: they learned no more than word "
                                                           "frequencies (empty where the baseline is unknown)")


class BudgetFamilyOut(BaseModel):
    family: str
    tokens: int | None = Field(description="training tokens its tuning has spent; null where not recorded")
    compute_seconds: float | None = Field(description="device-seconds its tuning has spent (`compute_unit`)")
    tokens_per_second: float | None = Field(description="training tokens per device-second")
    best_at_equal_tokens: float | None = Field(description="its best score within `equal_tokens` (+5%)")
    best_at_equal_compute: float | None = Field(description="its best score within `equal_compute_seconds` (+5%)")


class BudgetCurvesOut(BaseModel):
    unit: str
    compute_unit: str = Field(description="CPU core-seconds or GPU-seconds")
    equal_tokens: int | None = Field(description="the fewest training tokens any family's tuning has spent")
    equal_compute_seconds: float | None = Field(description="the fewest device-seconds any family's tuning has spent")
    families: list[BudgetFamilyOut]
    figure: dict[str, Any]


class HistoryBest(BaseModel):
    trial_id: int
    number: int
    score: float


class HistoryOut(BaseModel):
    unit: str
    figure: dict[str, Any]
    best: dict[str, HistoryBest]
    counts: dict[str, int]


class CurvesOut(BaseModel):
    unit: str
    trial_ids: list[int]
    averaging_switches: dict[int, list[int]]
    figure: dict[str, Any]


class ParallelOut(BaseModel):
    family: str
    unit: str
    trials: int
    best_trial_id: int | None
    neighbourhood: list[int]
    figure: dict[str, Any]


class ImportanceOut(BaseModel):
    evaluator: str
    importances: dict[str, dict[str, float]]
    figure: dict[str, Any]


IDENTIFIER = r"^[A-Za-z0-9_]+$"  # hyperparameter and family names


class SensitivityIn(BaseModel):
    model_config = ConfigDict(strict=True)  # true is not 1 seed

    parameter: str = Field(max_length=64, pattern=IDENTIFIER,
                           description="the hyperparameter to move (one the family searched)")
    seeds: int = Field(3, ge=SEEDS.start, le=SEEDS.stop - 1, description="training seeds per moved value")
    points: int = Field(5, ge=POINTS.start, le=POINTS.stop - 1,
                        description="moved values across best ± 15% of the range")
    family: str | None = Field(None, max_length=32, pattern=IDENTIFIER,
                               description="whose best to move; default: the best family")


class SensitivityPlanOut(BaseModel):
    study: str
    family: str
    parameter: str
    best_trial_id: int
    best_value: float
    values: list[float]
    seeds: list[int]
    queued: int
    page: str


class EffectPoint(BaseModel):
    family: str
    value: float
    mean: float
    std: float
    count: int


class SensitivityOut(BaseModel):
    parameter: str
    unit: str
    best_values: dict[str, float]
    pending: int
    effect: list[EffectPoint]
    figure: dict[str, Any]
