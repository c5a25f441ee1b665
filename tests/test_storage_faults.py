"""A checkpoint the artifact store cannot take (full, over quota, read-only, not permitted) fails with a reason that
names the cause and the file, and leaves the last good checkpoint as it was: no half-written file a resume would
load, no temporary file left to fill the store further. Faults are injected at the file the checkpoint is written
to; where this process may mount a filesystem (root), a real full one too. The trials the store failed are not
settled: a resume runs them again, and a study is never complete without a complete trial (tests without Ray here;
tests/test_storage_fault_study.py runs them on Ray)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers import artifact_store
from lm_tuner.trainers.artifact_store import StoreWriteError
from lm_tuner.trainers.checkpoint import load_training_state, save_checkpoint
from lm_tuner.trainers.corpus import Vocabulary
from lm_tuner.tuner.run import controller
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec, parse_spec
from lm_tuner.tuner.store.engine import ensure_schema, optuna_storage, sessions
from lm_tuner.tuner.store.file_identity import DatabaseReplaced
from lm_tuner.tuner.store.ledger import record_end, settled_trials
from lm_tuner.tuner.store.optuna_names import optuna_study_name
from lm_tuner.tuner.store.schema import TrialRecord
from lm_tuner.tuner.store.storage import Storage

CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
          errno.EACCES: "permission denied", errno.EROFS: "read-only file system"}


class _FillingFile:
    """A file that takes `room` bytes, then fails every write with OSError(`code`), as a full disk does."""

    def __init__(self, handle: Any, room: int, code: int) -> None:
        self._handle, self._room, self._code = handle, room, code

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            self._handle.write(bytes(data)[:self._room])
            self._room = 0
            raise OSError(self._code, os.strerror(self._code))
        self._room -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


@pytest.fixture
def store_fills(monkeypatch) -> Iterator[dict[str, int]]:
    """Temporary files opened for writing take `room` bytes (default: none more), then fail with `code`."""
    fault = {"room": 0, "code": errno.ENOSPC}
    opened = Path.open

    def open_filling(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = opened(path, mode, *args, **kwargs)
        if "w" in mode and path.name.endswith(".tmp"):
            return _FillingFile(handle, fault["room"], fault["code"])
        return handle

    monkeypatch.setattr(Path, "open", open_filling)
    yield fault


def _model() -> tuple[LanguageModel, Vocabulary]:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=20, hidden_size=8, num_layers=1)
    return LanguageModel(config), Vocabulary(tuple(f"w{i}" for i in range(20)))


@pytest.mark.parametrize("code", list(CAUSES))
def test_a_checkpoint_the_store_refuses_names_the_cause_and_keeps_the_last_one(tmp_path, store_fills, code):
    model, vocabulary = _model()
    latest = tmp_path / "study" / "lstm" / "trial-00000" / "latest.pt"
    store_fills["room"] = 1 << 30
    save_checkpoint(latest, model, vocabulary, {"turn": 1}, training_state={"turn": 1})
    good = latest.read_bytes()
    store_fills.update(room=100, code=code)  # the next turn's checkpoint finds the store full after 100 bytes

    with pytest.raises(StoreWriteError) as raised:
        save_checkpoint(latest, model, vocabulary, {"turn": 2}, training_state={"turn": 2})

    assert str(raised.value) == f"artifact store: {CAUSES[code]} writing {latest}"  # not "unexpected pos 100 vs 0"
    assert raised.value.errno == code
    assert latest.read_bytes() == good and load_training_state(latest)[1] == {"turn": 1}
    assert sorted(path.name for path in latest.parent.iterdir()) == ["latest.pt"]  # no half-written temporary file


def test_a_folder_the_store_cannot_make_is_named_too(tmp_path):
    (tmp_path / "study").write_text("a file where the study's folder should be")
    location = tmp_path / "study" / "lstm" / "best.pt"

    with pytest.raises(StoreWriteError, match=f"^artifact store: .* writing {location}$") as raised:
        artifact_store.write_atomically(location, lambda path: path.write_bytes(b"weights"))

    assert raised.value.errno in (errno.ENOTDIR, errno.EEXIST)


@pytest.fixture
def small_filesystem(tmp_path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root, or CAP_SYS_ADMIN); the test is skipped where it cannot be mounted."""
    folder = tmp_path / "store"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def test_on_a_really_full_filesystem_the_last_checkpoint_survives(small_filesystem):
    model, vocabulary = _model()
    latest = small_filesystem / "latest.pt"
    save_checkpoint(latest, model, vocabulary, {"turn": 1}, training_state={"turn": 1})
    good = latest.read_bytes()

    with pytest.raises(StoreWriteError, match=f"^artifact store: no space left on device writing {latest}$"):
        save_checkpoint(latest, model, vocabulary, {"turn": 2},
                        training_state={"turn": 2, "ballast": os.urandom(1 << 16)})

    assert latest.read_bytes() == good and os.listdir(small_filesystem) == ["latest.pt"]


def _every_trial_fails(reason: str, *, interrupted: bool) -> Callable[..., None]:
    """Stands in for the tuning stage (no Ray): each family's trials are told to Optuna and recorded as failed."""

    def tune(spec: StudySpec, vocab_size: int, settings: Settings, callbacks: object) -> None:
        url = settings.storage_url
        for family in spec.families:
            study = optuna.create_study(study_name=optuna_study_name(spec.name, family), storage=optuna_storage(url),
                                        load_if_exists=True)
            for _ in range(spec.tuning.trials - settled_trials(url, optuna_study_name(spec.name, family))):
                trial = study.ask()
                with sessions(url).begin() as session:
                    session.add(TrialRecord(trial_id=trial._trial_id, study_name=spec.name, family=family,
                                            number=trial.number, seed=0))
                study.tell(trial, state=TrialState.FAIL)
                record_end(url, trial._trial_id, TrialState.FAIL, reason=reason, interrupted=interrupted)

    return tune


@pytest.fixture
def no_ray(monkeypatch) -> None:
    monkeypatch.setattr(controller, "connect_ray", lambda settings: None)


def test_a_study_is_never_complete_without_a_complete_trial(no_ray, storage_url, tiny_spec, tmp_path, monkeypatch):
    document = tiny_spec()
    diverging = _every_trial_fails("TrainingDiverged: loss is nan", interrupted=False)
    monkeypatch.setattr(controller, "tune_families", diverging)

    status = launch_study(parse_spec(document), document, Settings(storage_url, tmp_path / "artifacts"))

    study = Storage(storage_url).study("tiny")
    assert (status, study.status) == ("failed", "failed")
    assert study.error == "no tuning trial completed: every one failed or was stopped early (`tuner status tiny` " \
                          "shows why)"


def test_trials_the_store_failed_are_not_settled_and_a_resume_runs_them(no_ray, storage_url, tiny_spec, tmp_path,
                                                                        monkeypatch):
    document = tiny_spec()
    settings = Settings(storage_url, tmp_path / "artifacts")
    fault = f"artifact store: no space left on device writing {tmp_path}/artifacts/tiny/lstm/trial-00000/latest.pt"
    monkeypatch.setattr(controller, "tune_families", _every_trial_fails(fault, interrupted=True))

    assert launch_study(parse_spec(document), document, settings) == "failed"
    assert Storage(storage_url).study("tiny").error == f"2 trial(s) stopped: {fault}; once the store takes files " \
                                                        f"again, `tuner resume tiny` runs them"
    assert settled_trials(storage_url, "tiny/lstm") == 0

    monkeypatch.setattr(controller, "tune_families", _every_trial_fails("TrainingDiverged: loss is nan",
                                                                        interrupted=False))
    launch_study(parse_spec(document), document, settings)  # the resume: the store's trials run again

    assert settled_trials(storage_url, "tiny/lstm") == settled_trials(storage_url, "tiny/mogrifier") == 1


def test_a_database_file_deleted_under_a_process_is_neither_read_nor_written(sqlite_url, tmp_path):
    ensure_schema(sqlite_url)
    storage = optuna_storage(sqlite_url)
    assert storage.get_all_studies() == [] and Storage(sqlite_url).study("tiny") is None
    (tmp_path / "tuner.db").unlink()

    for use in (storage.get_all_studies, lambda: Storage(sqlite_url).study("tiny"),
                lambda: optuna.create_study(study_name="tiny/lstm", storage=storage)):
        with pytest.raises(DatabaseReplaced, match=f"^database: {tmp_path / 'tuner.db'} was deleted after this "
                                                   f"process opened it; nothing more is written"):
            use()
    assert not (tmp_path / "tuner.db").exists()  # no new, empty database in its place
