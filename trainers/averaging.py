"""Weight averaging: which weights are evaluated at the end of each turn, as a configuration and the
strategy `make_averaging` builds from it.

Three interchangeable strategies average the iterates of the optimiser (the raw weights keep
training unchanged):
- triggered tail averaging (Melis et al. 2020): a uniform average starts after `patience` turns
  without improvement, or once `latest_start` of the budget is used;
- NT-ASGD (Merity et al. 2017): the same with a non-monotone trigger;
- Two-Tailed Averaging (Melis 2022, thesis ch. 3, Algorithms 1 and 2): a short and a long running
  average whose lengths adapt to the validation loss; no trigger at all.
The first two live in `triggered_averaging`, the third in `two_tailed_averaging`, the protocol they
share in `averaging_protocol`; `NoAveraging` (the default) is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from lm_tuner.trainers.averaging_protocol import Averaging, Evaluated, LossOf, Weights
from lm_tuner.trainers.triggered_averaging import TriggeredAveraging, non_monotone_trigger, tail_trigger
from lm_tuner.trainers.two_tailed_averaging import TwoTailedAveraging


class NoAveraging:
    """Evaluate the raw weights, always."""

    def add(self, weights: Sequence[Tensor]) -> None:
        pass

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        return Evaluated(loss_of(raw), raw, 1)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none"] = "none"


class TailAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tail"] = "tail"
    patience: int = Field(5, ge=1, description="turns without improvement that start the average")
    latest_start: float = Field(0.8, gt=0, le=1, description="fraction of the budget after which it starts anyway")


class NTASGDConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["nt-asgd"] = "nt-asgd"
    interval: int = Field(5, ge=1, description="non-monotone interval n (evaluations)")


class TwoTailedAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["2ta"] = "2ta"
    patience: int = Field(3, ge=1, description="evaluations without improvement that make an average stagnating")


AveragingConfig = Annotated[
    NoAveragingConfig | TailAveragingConfig | NTASGDConfig | TwoTailedAveragingConfig, Field(discriminator="kind")
]


def make_averaging(config: AveragingConfig, like: Sequence[Tensor]) -> Averaging:
    if isinstance(config, TailAveragingConfig):
        return TriggeredAveraging(like, tail_trigger(config.patience, config.latest_start))
    if isinstance(config, NTASGDConfig):
        return TriggeredAveraging(like, non_monotone_trigger(config.interval))
    if isinstance(config, TwoTailedAveragingConfig):
        return TwoTailedAveraging(like, config.patience)
    return NoAveraging()
