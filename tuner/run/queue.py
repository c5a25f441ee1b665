"""The queue of submitted studies, and the worker loop that runs them one at a time."""

from __future__ import annotations

import logging
import threading
import time

import ray
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from lm_tuner.tuner.run.controller import (
    StudyConflict,
    StudyRefused,
    connect_ray,
    controller_alive,
    ray_address,
    run_claimed_study,
    this_controller,
)
from lm_tuner.tuner.run.processes import stop_signals_held
from lm_tuner.tuner.run.sensitivity import run_queued_sensitivity, studies_with_queued_sensitivity
from lm_tuner.tuner.settings import RAY_IDLE_SECONDS, Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.store import claims
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import StudyRecord, families_column
from lm_tuner.tuner.store.studies import in_study_store

log = logging.getLogger(__name__)


def submit_study(url: str, spec: StudySpec, document: str, submitted_via: str = "api", *,
                 unigram_perplexity: float | None = None) -> None:
    """Queue a study for a worker (with the unigram perplexity of its data, where the caller has read it); a taken
    name is a StudyConflict."""
    try:
        with sessions(url).begin() as session:
            session.add(StudyRecord(name=spec.name, status="queued", spec=spec.model_dump(mode="json"),
                                    families=families_column(spec.families), document=document,
                                    submitted_via=submitted_via, unigram_perplexity=unigram_perplexity))
    except IntegrityError as error:
        raise StudyConflict(f"name: a study named {spec.name!r} already exists; choose another name") from error


def stored_spec(url: str, name: str) -> tuple[StudySpec, str] | None:
    """The spec and the document of a study as it was submitted, or None if there is no such study."""
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
    return None if record is None else (StudySpec.model_validate(record.spec), record.document)


def claim_next_study(url: str) -> StudySpec | None:
    """Take the oldest queued study — or one whose controller on this machine died — for this process. A study
    another process claims at the same moment is left to it (tuner.store.claims)."""
    for seen in claims.seen_runnable(url):
        if seen.status == "running" and (seen.controller is None or controller_alive(seen.controller)):
            continue
        if claims.claimed_if_unchanged(url, seen, this_controller()):
            return StudySpec.model_validate(seen.spec)
    return None


def run_worker(settings: Settings, *, poll_seconds: float = 2.0, once: bool = False,
               stop: threading.Event | None = None, ray_idle_seconds: float = RAY_IDLE_SECONDS) -> int:
    """Run queued studies, then queued sensitivity runs, until stopped (or, with `once`, until both queues are
    empty); returns how many studies ran. A private local Ray that the worker starts is shut down once both queues
    have been empty for `ray_idle_seconds` (its processes hold a gigabyte or more) and started again by the next
    study; a Ray this process had before the worker started is left to its owner."""
    ensure_schema(settings.storage_url)
    stop = stop or threading.Event()
    owns_ray = not ray.is_initialized() and ray_address(settings) == "local"
    ran, idle_since = 0, None
    while not stop.is_set():
        spec = claim_next_study(settings.storage_url)
        if spec is None:
            if run_sensitivity_requests(settings):
                idle_since = None
                continue
            idle_since = idle_since or time.monotonic()
            if owns_ray and ray.is_initialized() and (once or time.monotonic() - idle_since >= ray_idle_seconds):
                with stop_signals_held():  # a stop waits for the shutdown, and keeps this process's handlers
                    ray.shutdown()
                log.info("queue empty: Ray shut down until the next study")
            if once:
                break
            stop.wait(poll_seconds)
            continue
        idle_since = None
        log.info("running study %s", spec.name)
        try:
            status = run_claimed_study(spec, settings)
            log.info("study %s finished: %s", spec.name, status)
        except KeyboardInterrupt:
            requeue_study(settings.storage_url, spec.name)
            log.info("study %s put back in the queue; a worker will continue it", spec.name)
            raise
        except (StudyRefused, StudyConflict) as error:  # expected (no data, no network...): one line, as recorded
            log.error("study %s failed: %s", spec.name, error, exc_info=log.isEnabledFor(logging.DEBUG))
        except Exception:  # recorded on the study by the controller; the worker keeps serving the queue
            log.exception("study %s failed", spec.name)
        ran += 1
    return ran


def run_sensitivity_requests(settings: Settings) -> int:
    """Train the sensitivity runs requested over REST (queued as WAITING trials); returns how many ran."""
    url = settings.storage_url
    ran = 0
    for name in studies_with_queued_sensitivity(url):
        log.info("measuring sensitivity in study %s", name)
        connect_ray(settings)
        # in the study's own store, where its checkpoints are, whichever this worker was given
        ran += run_queued_sensitivity(stored_spec(url, name)[0], in_study_store(settings, name))
    return ran


def requeue_study(url: str, name: str) -> None:
    """Return a study interrupted by a stopping worker to the queue, so the next worker continues it.
    A study that already finished (the stop came while its controller was tidying up) stays finished."""
    with sessions(url).begin() as session:
        session.execute(update(StudyRecord).where(StudyRecord.name == name, StudyRecord.status == "running")
                        .values(status="queued", controller=None, finished_at=None,
                                error="interrupted when its worker stopped; queued to continue"))
