"""Read models of studies and trials, queried from Optuna's tables and the project's own in SQL.

The CLI, the API and the dashboard read through here, so they always agree. Every query is paged
or aggregated in the database: a study of thousands of trials is never loaded whole to answer one
page.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from sqlalchemy import Select, bindparam, func, select

from lm_tuner.tuner.settings import ArtifactRoot, Settings, artifact_root
from lm_tuner.tuner.store.engine import reading, retried_on_disconnect, sessions
from lm_tuner.tuner.store.progress import (
    StudyProgress,
)
from lm_tuner.tuner.store.progress_queries import read_progress
from lm_tuner.tuner.store.schema import (
    StudyRecord,
    TrialCountRecord,
    TrialRecord,
)
from lm_tuner.tuner.store.trials import study_trials, trials_by_id
from lm_tuner.tuner.store.views import TRIAL_STATES, Page, StudyView, TrialView


@retried_on_disconnect
def list_studies(url: str, *, status: str | None = None, family: str | None = None, name_contains: str | None = None,
                 limit: int | None = None, offset: int = 0) -> Page[StudyView]:
    """Studies, newest first, filtered and paged in the database: two queries whatever the page size."""
    values = {"status": status, "family": family and _containing(f",{family},"),
              "name": name_contains and _containing(name_contains), "limit": limit, "offset": offset}
    query, count = _study_page_queries(bool(status), bool(family), bool(name_contains), limit is not None)
    with reading(url) as connection:
        rows = connection.execute(query, values).all()
        total = rows[0].total if rows else connection.scalar(count, values)
        best = _best_views(connection, rows)
        progress = read_progress(connection, rows)
    return Page([_study_view(row, best.get(row.best_trial_id), progress[row.name]) for row in rows], total, limit,
                offset)


def _containing(text: str) -> str:
    """A LIKE pattern (escape character /) matching values that contain `text` literally."""
    return "%" + text.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


@cache
def _study_page_queries(by_status: bool, by_family: bool, by_name: bool, limited: bool) -> tuple[Select, Select]:
    """The page and the count statements for one combination of filters, their values bound at execution."""
    filters = []
    if by_status:
        filters.append(StudyRecord.status == bindparam("status"))
    if by_family:
        filters.append(StudyRecord.families.like(bindparam("family"), escape="/"))
    if by_name:
        filters.append(StudyRecord.name.like(bindparam("name"), escape="/"))
    page = (_summary_query().add_columns(func.count().over().label("total")).where(*filters)
            .order_by(StudyRecord.created_at.desc(), StudyRecord.id.desc()).offset(bindparam("offset")))
    if limited:
        page = page.limit(bindparam("limit"))
    return page, select(func.count()).select_from(StudyRecord).where(*filters)


def study_families(url: str) -> list[str]:
    """Every family some study compares, sorted (for filters)."""
    with sessions(url)() as session:
        stored = session.scalars(select(StudyRecord.families).distinct()).all()
    return sorted({family for families in stored for family in families.strip(",").split(",") if family})


def study_exists(url: str, name: str) -> bool:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord.id).where(StudyRecord.name == name)) is not None


def study_artifact_root(url: str, name: str) -> ArtifactRoot | None:
    """The artifact store the study's checkpoints were written to (a folder, or an object-storage URL), as the
    process that ran it recorded it."""
    with sessions(url)() as session:
        root = session.scalar(select(StudyRecord.artifact_root).where(StudyRecord.name == name))
    return None if root is None else artifact_root(root)


def study_artifacts(settings: Settings, name: str, given: str | None = None) -> ArtifactRoot:
    """Where study `name`'s checkpoints are: the store `given` names (--artifacts), else the one the study ran with,
    else `settings`' own."""
    if given:
        return artifact_root(given)
    return study_artifact_root(settings.storage_url, name) or settings.artifact_root


def in_study_store(settings: Settings, name: str, given: str | None = None) -> Settings:
    """`settings` whose artifact store is study `name`'s (`study_artifacts`): a study continues, and its later runs
    write, where its checkpoints are. The schema must exist."""
    return dataclasses.replace(settings, artifact_root=study_artifacts(settings, name, given))


def stored_warnings(url: str, name: str) -> list[str]:
    """What the study's run has warned about so far, oldest first (none for an unknown study)."""
    with sessions(url)() as session:
        return list(session.scalar(select(StudyRecord.warnings).where(StudyRecord.name == name)) or [])


@retried_on_disconnect
def get_study(url: str, name: str) -> StudyView | None:
    with reading(url) as connection:
        row = connection.execute(_study_query(), {"name": name}).first()
        if row is None:
            return None
        best = _best_views(connection, [row])
        progress = read_progress(connection, [row])
    return _study_view(row, best.get(row.best_trial_id), progress[row.name])


def best_trials(url: str, name: str) -> dict[str, TrialView | None] | None:
    """The best complete trial per family (None for a family without one); None if no such study."""
    study = get_study(url, name)
    if study is None:
        return None
    return {family: next(iter(study_trials(url, name, state="COMPLETE", family=family, stage="tune", sort="value",
                                           limit=1).items), None) for family in study.families}


@cache  # built once: statements are immutable, and building one costs more than running it
def _summary_query() -> Select:
    """A study's own columns, with its tuning trials per state (counted by triggers as trials are
    written) and its best complete tuning trial (a correlated subquery): one statement for a page."""
    counts = [func.coalesce(getattr(TrialCountRecord, f"tuning_{state.lower()}"), 0).label(f"count_{state}")
              for state in TRIAL_STATES]
    best = (select(TrialRecord.trial_id)
            .where(TrialRecord.study_name == StudyRecord.name, TrialRecord.stage == "tune",
                   TrialRecord.state == "COMPLETE")
            .order_by(TrialRecord.value, TrialRecord.trial_id).limit(1).scalar_subquery().label("best_trial_id"))
    return (select(StudyRecord.name, StudyRecord.status, StudyRecord.spec, StudyRecord.created_at,
                   StudyRecord.started_at, StudyRecord.finished_at, StudyRecord.error, StudyRecord.best_possible_loss,
                   StudyRecord.unigram_perplexity, StudyRecord.corpus_digest, StudyRecord.warnings, *counts, best)
            .outerjoin(TrialCountRecord, TrialCountRecord.study_name == StudyRecord.name))


@cache
def _study_query() -> Select:
    return _summary_query().where(StudyRecord.name == bindparam("name"))


def _best_views(connection, rows) -> dict[int, TrialView]:
    ids = [row.best_trial_id for row in rows if row.best_trial_id is not None]
    return {view.trial_id: view for view in trials_by_id(connection, ids)} if ids else {}


def _study_view(row, best: TrialView | None, progress: StudyProgress) -> StudyView:
    spec = row.spec
    return StudyView(
        name=row.name,
        status=row.status,
        description=spec.get("description", ""),
        families=list(spec["families"]),
        parameter_budget=spec["parameter_budget"],
        trials_per_family=spec["tuning"]["trials"],
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        best_possible_loss=row.best_possible_loss,
        unigram_perplexity=row.unigram_perplexity,
        corpus_digest=row.corpus_digest,
        spec=spec,
        progress=progress,
        counts={state: getattr(row, f"count_{state}") for state in TRIAL_STATES},
        best=best,
        warnings=list(row.warnings or []),
    )
