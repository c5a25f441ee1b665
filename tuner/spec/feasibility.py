"""Whether a valid spec can run at all: each family's model must fit the parameter budget, and the task must be
learnable with the schedule (a reverse-copy example must fit in a training window).

The controller makes the budget check (`trial_setup` with the fixed values) once the corpus is loaded;
`submission_issues` makes it when a study is submitted, with the vocabulary size the dataset section
fixes (generated corpora, PTB) or else the smallest any corpus can have, so that what is refused then
would certainly fail later. `tuner launch` and `POST /studies` refuse the task issues too; `tuner plan` shows them.
"""

from __future__ import annotations

from lm_tuner.trainers.datasets import known_vocabulary_size
from lm_tuner.trainers.generated import ReverseCopyConfig
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
        issues = [SpecIssue(i.field, f"{i.message} (this dataset's vocabulary is known only once it is loaded, and "
                                     f"can only make the model larger)") for i in issues]
    return issues + task_issues(spec)


def reverse_copy_example_tokens(dataset: ReverseCopyConfig) -> int:
    """Tokens of one reverse-copy example: the symbols, <sep>, the symbols reversed, <eos>."""
    return 2 * dataset.length + 2


def task_issues(spec: StudySpec) -> list[SpecIssue]:
    """What the task makes impossible whatever the hyperparameters: a reverse-copy example longer than a training
    window (bptt < 2L + 2)."""
    if not isinstance(spec.dataset, ReverseCopyConfig):
        return []
    example = reverse_copy_example_tokens(spec.dataset)
    if spec.training.bptt >= example:
        return []
    return [SpecIssue("training.bptt", f"got {spec.training.bptt}; allowed: at least 2 * dataset.length + 2 = "
                                       f"{example}, so that a whole reverse-copy example fits in one training window "
                                       f"(the gradient of each reversed symbol must reach the symbol it copies); "
                                       f"or give a shorter dataset.length")]


def reverse_copy_learnable_share(spec: StudySpec) -> float | None:
    """The share of reverse-copy examples whose reversal (the first symbol in, its copy out 2L tokens later) lies
    inside one training window; None for other datasets. Windows do not start where examples do: of the W positions
    an example can start at in a window of W tokens, W - 2L + 1 keep its reversal inside."""
    if not isinstance(spec.dataset, ReverseCopyConfig):
        return None
    window = spec.training.bptt
    return max(0, window - 2 * spec.dataset.length + 1) / window
