"""What `POST /studies` (and `POST /studies/validate`) check against the study's data before queueing it: the
vocabulary is read as `POST /studies/plan` reads it, so a study gets the plan's shape warnings, and one whose data
cannot be read, or whose families fit no model at its vocabulary, is refused as `tuner launch` refuses it.

A registered dataset that is not downloaded yet is not fetched inside a request: the worker downloads it when it
starts the study, and the answer says so, with how to get it onto the server now; where only its files tell its
vocabulary, the shape checks wait for that worker too."""

from __future__ import annotations

from lm_tuner.trainers import RegisteredDatasetConfig, registered
from lm_tuner.trainers.datasets import known_vocabulary_size
from lm_tuner.trainers.registry import how_to_get, is_fetched
from lm_tuner.tuner.run.machine import this_machine
from lm_tuner.tuner.run.study_data import DatasetUnavailable, corpus_size, data_warnings, vocabulary_size
from lm_tuner.tuner.spec import SpecIssue, StudySpec
from lm_tuner.tuner.spec.cost import with_counted_cost
from lm_tuner.tuner.spec.estimate import Machine, known_corpus_size
from lm_tuner.tuner.spec.feasibility import budget_issues, submission_issues, task_issues
from lm_tuner.tuner.spec.plan import StudyCost, plan_study, study_warnings


def data_checks(spec: StudySpec) -> tuple[list[SpecIssue], list[str]]:
    """What a submission is refused for and, if nothing, what it is warned about (the plan's warnings without its
    probe). Reads the dataset, perhaps for seconds: call it off the event loop."""
    undownloaded = _undownloaded_name(spec)
    if undownloaded is not None and known_vocabulary_size(spec.dataset) is None:
        return submission_issues(spec), [*study_warnings(spec, None), _not_downloaded(undownloaded, checked=False)]
    try:
        vocab_size = vocabulary_size(spec)
    except DatasetUnavailable as error:  # with what would fail at any vocabulary
        return [SpecIssue("dataset", error.problem), *submission_issues(spec)], []
    issues = budget_issues(spec, vocab_size) + task_issues(spec)
    if issues:
        return issues, []
    if undownloaded is not None:  # its vocabulary is known without the files: the shapes are checked
        return [], [*study_warnings(spec, vocab_size), _not_downloaded(undownloaded, checked=True)]
    return [], [*study_warnings(spec, vocab_size), *data_warnings(spec)]


def submission_cost(spec: StudySpec) -> StudyCost | None:
    """What the study costs, from a FLOP count (as `tuner launch` prints it), on this server's machine; None where its
    corpus's sizes are unknown here (a registered dataset other than PTB, not downloaded). Call it once data_checks
    found nothing to refuse: it reads the data that call read (cached)."""
    size = known_corpus_size(spec.dataset)
    if size is None and _undownloaded_name(spec) is not None:
        return None
    size = size or corpus_size(spec)
    return with_counted_cost(spec, plan_study(spec, size.vocab_size), size, server_machine()).cost


def server_machine() -> Machine:
    """This server's machine, named so in estimates: a client reading "this machine" would take it for its own."""
    return this_machine().model_copy(update={"called": "the server's machine"})


def _undownloaded_name(spec: StudySpec) -> str | None:
    """The name of a registered dataset that is not in this server's cache; None otherwise."""
    dataset = spec.dataset
    if not isinstance(dataset, RegisteredDatasetConfig) or is_fetched(registered(dataset.name)):
        return None
    return dataset.name


def _not_downloaded(name: str, *, checked: bool) -> str:
    """The warning for a registered dataset this server has not downloaded; `checked`: its vocabulary is known without
    its files, so the shape checks have run."""
    deferred = "" if checked else (
        ", and its vocabulary, and with it each family's hidden size and parameter split, is unknown: the shape "
        "checks (and the parameter_budget check) run when the worker reads the data, and a study that fails them "
        "ends there")
    return (f"dataset: {name!r} is not downloaded on this server yet{deferred}; the worker downloads it when it starts "
            f"the study, which fails there if this server cannot reach it. To have it now, on the server: "
            f"{how_to_get(registered(name))}" + ("" if checked else "; or POST /studies/plan, which downloads it, to "
                                                                    "check the shapes now"))
