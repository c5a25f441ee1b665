"""Which of this server's own folders a submitted spec may make it read (a dataset's `path`): POST /studies,
/studies/validate and /studies/plan read the data to check a study against it.

Reading the server's files needs a valid token whenever the server has tokens, even where reads are public; and
where the operator named data folders (`tuner serve --data-folder PATH`), only folders inside them are read. A
folder outside them is refused before anything looks at it, so a missing folder and an existing one get the same
answer: the refusal tells nothing about the server's files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from lm_tuner.api.deps import Credentials, SettingsDep, presented_token
from lm_tuner.trainers.datasets import LocalDatasetConfig, TextDatasetConfig
from lm_tuner.tuner.settings import DATA_FOLDERS_VARIABLE, Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.store import Storage

FOLDER_OPTION = "--data-folder"
DATA_ACCESS = {401: {"description": "the spec's dataset is read from this server's files, which needs a token on a "
                                    "server with tokens"},
               403: {"description": "the spec's dataset folder is outside the folders this server reads data from"}}
"""Documented on the operations that read a submitted spec's data."""


@dataclass(frozen=True)
class DataAccess:
    """What one request may make this server read."""

    config: Settings
    token: str | None

    def check(self, spec: StudySpec) -> None:
        """Nothing where the spec reads no local folder, or may; else 401 or 403. Queries the database: call it off
        the event loop."""
        dataset = spec.dataset
        if not isinstance(dataset, LocalDatasetConfig | TextDatasetConfig):
            return
        storage = Storage(self.config.storage_url)
        if storage.auth_enabled() and (self.token is None or not storage.token_is_valid(self.token)):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                                "dataset.path: reading data from this server's own files needs a valid bearer token "
                                "on this server (even where reads are public); send `Authorization: Bearer TOKEN`, or "
                                "sign in to the dashboard", headers={"WWW-Authenticate": "Bearer"})
        folders = self.config.data_folders
        if folders and not inside(dataset.path, folders):
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"dataset.path: {dataset.path!r} is not inside the folders this server reads data "
                                f"from ({', '.join(map(str, folders))}); the operator names them with `tuner serve "
                                f"{FOLDER_OPTION} PATH` (or ${DATA_FOLDERS_VARIABLE})")


def inside(path: str, folders: tuple[Path, ...]) -> bool:
    """Whether `path` (absolute) lies in one of `folders`: first by its text alone (against each folder as written
    and with its links followed), so that a path outside is refused without touching the file system; then with
    its own links followed, so that none leads out."""
    written = Path(os.path.normpath(path))
    real_folders = [folder.resolve() for folder in folders]
    if not any(written.is_relative_to(folder) for folder in (*folders, *real_folders)):
        return False
    return any(written.resolve().is_relative_to(folder) for folder in real_folders)


async def data_access(request: Request, config: SettingsDep, credentials: Credentials) -> DataAccess:
    return DataAccess(config, presented_token(request, credentials))


DataAccessDep = Annotated[DataAccess, Depends(data_access)]
