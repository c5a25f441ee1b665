"""What `POST /studies` (and `POST /studies/validate`) check against the study's data before queueing it: the
vocabulary is read as `POST /studies/plan` reads it, so a study gets the plan's shape warnings, and one whose data
cannot be read, or whose families fit no model at its vocabulary, is refused as `tuner launch` refuses it.

A registered dataset that is not downloaded yet is not fetched inside a request: its shape checks wait for the
worker that reads it, and the answer says so."""

from __future__ import annotations

from lm_tuner.trainers import RegisteredDatasetConfig, default_cache_dir, registered
from lm_tuner.trainers.datasets import known_vocabulary_size
from lm_tuner.tuner.run.probe import DatasetUnavailable, data_warnings, vocabulary_size
from lm_tuner.tuner.spec import SpecIssue, StudySpec
from lm_tuner.tuner.spec.feasibility import budget_issues, submission_issues, task_issues
from lm_tuner.tuner.spec.plan import study_warnings


def data_checks(spec: StudySpec) -> tuple[list[SpecIssue], list[str]]:
    """What a submission is refused for and, if nothing, what it is warned about (the plan's warnings without its
    probe). Reads the dataset, perhaps for seconds: call it off the event loop."""
    undownloaded = _undownloaded_name(spec)
    if undownloaded is not None:
        return submission_issues(spec), [*study_warnings(spec, None), _deferred_checks(undownloaded)]
    try:
        vocab_size = vocabulary_size(spec)
    except DatasetUnavailable as error:  # with what would fail at any vocabulary
        return [SpecIssue("dataset", error.problem), *submission_issues(spec)], []
    issues = budget_issues(spec, vocab_size) + task_issues(spec)
    return issues, [] if issues else [*study_warnings(spec, vocab_size), *data_warnings(spec)]


def _undownloaded_name(spec: StudySpec) -> str | None:
    """The name of a registered dataset whose vocabulary only its files can tell and that is not in this server's
    cache; None otherwise."""
    dataset = spec.dataset
    if not isinstance(dataset, RegisteredDatasetConfig) or known_vocabulary_size(dataset) is not None:
        return None
    folder = default_cache_dir() / dataset.name
    downloaded = all((folder / member).is_file() for member in registered(dataset.name).members)
    return None if downloaded else dataset.name


def _deferred_checks(name: str) -> str:
    return (f"dataset: {name!r} is not downloaded on this server yet, so its vocabulary, and with it each family's "
            f"hidden size and parameter split, is unknown: the shape checks (and the parameter_budget check) run "
            f"when the worker reads the data, and a study that fails them ends there; run `tuner data fetch {name}` "
            f"on the server, or POST /studies/plan (which downloads it), to check them now")
