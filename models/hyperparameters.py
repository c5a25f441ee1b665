"""A hyperparameter a study may fix or search: where its value goes, what it may be, which families have it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Hyperparameter:
    """One field of `ModelConfig` (target "model") or `TrainingConfig` (target "training") a study may set.

    `low`/`high` bound numbers (None: unbounded), inclusive unless `low_open`/`high_open`. `families` None
    means every family, those registered later included; a tuple names the only families it applies to.
    A family's own hyperparameters (`Family.hyperparameters`) leave it None: the registry fills it in
    (`family_hyperparameters`). `required`: a study of a family it applies to must fix or search it.
    """

    name: str
    target: Literal["model", "training"]
    kind: Literal["float", "int", "bool"]
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    families: tuple[str, ...] | None = None
    required: bool = False

    def applies_to(self, family: str) -> bool:
        return self.families is None or family in self.families

    def allowed(self) -> str:
        if self.kind == "bool":
            return "true or false"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        kind = "an integer" if self.kind == "int" else "a number"
        return f"{kind} in {left}{low}, {high}{right}"

    def accepts(self, value: object) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not float(value).is_integer():
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))
