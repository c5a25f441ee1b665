"""Whether a valid spec can run at all: each family's model must fit the parameter budget.

The controller makes the same check (`trial_setup` with the fixed values) once the corpus is loaded;
`submission_issues` makes it when a study is submitted, with the vocabulary size the dataset section
fixes (generated corpora, PTB) or else the smallest any corpus can have, so that what is refused then
would certainly fail later.
"""

from __future__ import annotations

from lm_tuner.trainers.datasets import known_vocabulary_size
from lm_tuner.tuner.spec.document import StudySpec
from lm_tuner.tuner.spec.issues import SpecIssue
from lm_tuner.tuner.spec.space import trial_setup

SMALLEST_VOCABULARY = 1  # a corpus has at least one token type


def budget_issues(spec: StudySpec, vocab_size: int) -> list[SpecIssue]:
    """The families whose model (with the fixed hyperparameters, the rest at their defaults) cannot be built
    within `parameter_budget` at this vocabulary size: the controller's check before any trial runs."""
    issues = []
    for family in spec.families:
        try:
            trial_setup(spec, family, {}, vocab_size, seed=0)
        except ValueError as error:  # "field: problem", from solve_hidden_size or ModelConfig
            name, _, problem = str(error).partition(": ")
            field = f"fixed.{name}" if name in spec.fixed else name
            issues.append(SpecIssue(field, f"family {family!r}: {problem}"))
    return issues


def submission_issues(spec: StudySpec) -> list[SpecIssue]:
    """What can be known to fail before the dataset is loaded."""
    known = known_vocabulary_size(spec.dataset)
    issues = budget_issues(spec, known or SMALLEST_VOCABULARY)
    if known is None:
        return [SpecIssue(i.field, f"{i.message} (this dataset's vocabulary is known only once it is loaded, and can "
                                   f"only make the model larger)") for i in issues]
    return issues
