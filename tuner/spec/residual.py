"""Residual families and the embedding size: a spec may not fix or search `input_embedding_ratio` != 1 for them.

The residual architecture (Melis thesis §4.2) assumes embedding size m = hidden size n "to allow for a residual
architecture without projections": the sums of the layers' outputs feed the layers above and the softmax
directly. Which families are residual is the registry's `Family.residual` (models.families)."""

from __future__ import annotations

from lm_tuner.models import family
from lm_tuner.tuner.spec.document import SearchRange, StudySpec
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS

RATIO = "input_embedding_ratio"
WHY = ("the residual architecture (Melis thesis §4.2) assumes embedding size = hidden size (m = n): the summed "
       "layer outputs feed the layers above and the softmax without projections")


def residual_ratio_issues(spec: StudySpec) -> list[tuple[tuple[str, ...], str]]:
    """(path, message) for a fixed or searched `input_embedding_ratio` other than 1 that reaches a residual family.

    A value other checks refuse already (not a number >= 0, fixed and searched at once) is left to them."""
    residual = [name for name in spec.families if family(name).residual]
    issues: list[tuple[tuple[str, ...], str]] = []
    fixed = spec.fixed.get(RATIO)
    if residual and fixed is not None and RATIO not in spec.search_space and HYPERPARAMETERS[RATIO].accepts(fixed) \
            and fixed != 1:
        issues.append((("fixed", RATIO), f"got {fixed!r} for {_named(residual)}; allowed: 1 (the default) — {WHY}"))
    searching = [name for name in residual if RATIO in spec.searched_for(name)]
    space = spec.search_space.get(RATIO)
    if searching and RATIO not in spec.fixed and not _only_one(space):
        others = [name for name in spec.families if name not in residual]
        remedy = (f"search it for {', '.join(repr(name) for name in others)} only (families: [...])" if others
                  else "leave it out (the default is 1)")
        issues.append((("search_space", RATIO), f"got {_shown(space)} for {_named(searching)}; allowed: 1 only, so "
                                                f"{remedy} — {WHY}"))
    return issues


def _only_one(space: SearchRange) -> bool:
    """A search over choices that are all 1: it searches nothing, and a residual family can use it."""
    return space.choices is not None and bool(space.choices) and all(
        not isinstance(choice, bool) and choice == 1 for choice in space.choices)


def _named(families: list[str]) -> str:
    kind = "residual family" if len(families) == 1 else "residual families"
    return f"{kind} {', '.join(repr(name) for name in families)}"


def _shown(space: SearchRange) -> str:
    return f"choices {space.choices}" if space.choices is not None else f"the range [{space.low}, {space.high}]"
