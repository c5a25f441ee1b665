"""The median best's confidence band (opda's simultaneous band on the score's CDF), its weights kept on disk.

The band's lower and upper CDFs put weights on the sorted trials that depend only on how many trials there are,
the confidence and the method. opda finds them by simulating the band's critical value (100,000 draws of n
order statistics), which took 10 s at 300 trials on one core, in every `tuner curves` and after every restart of
the API, and again at each new trial count. Here they are computed once per count and confidence, on a sample of
distinct values, and kept in the user's cache folder (`$XDG_CACHE_HOME/lm-tuner`, else `~/.cache/lm-tuner`) under
opda's version; the bands of real trials are then built from them exactly as opda builds its own. Confidences come
from clients of the API, so the folder is bounded: past MAX_KEPT_FILES files or MAX_KEPT_BYTES, the least recently
used go (tuning_curves rounds each confidence, so near-equal ones share a file).
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from contextlib import suppress
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import numpy as np
from opda.nonparametric import EmpiricalDistribution

LOSS_FLOOR = 0.0  # cross-entropy is never negative
BAND_METHOD = "ld_equal_tailed"
BAND_SEED = 0  # opda simulates the critical value: a fixed seed makes a band reproducible
MAX_KEPT_FILES = 256
MAX_KEPT_BYTES = 64 * 2**20

logger = logging.getLogger(__name__)


def confidence_band(values: np.ndarray, confidence: float
                    ) -> tuple[EmpiricalDistribution, EmpiricalDistribution, EmpiricalDistribution]:
    """opda's `EmpiricalDistribution.confidence_bands(values, confidence, a=0, method="ld_equal_tailed")`: the
    lower CDF band, the empirical distribution and the upper CDF band, from weights computed once per size."""
    values = np.asarray(values, dtype=float)
    lower_weights, upper_weights = band_weights(len(values), float(confidence))
    extended = np.concatenate([[LOSS_FLOOR], values, [np.inf]])
    ranks = np.argsort(np.argsort(extended))  # as opda orders them, so that tied values get the same weights
    return (EmpiricalDistribution(extended, ws=lower_weights[ranks], a=LOSS_FLOOR, b=np.inf),
            EmpiricalDistribution(values, a=LOSS_FLOOR, b=np.inf),
            EmpiricalDistribution(extended, ws=upper_weights[ranks], a=LOSS_FLOOR, b=np.inf))


@lru_cache(maxsize=64)
def band_weights(trials: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper bands' weights on the floor, the `trials` sorted values and infinity, in that order."""
    path = cache_folder() / f"{BAND_METHOD}-opda{version('opda')}-seed{BAND_SEED}-n{trials}-c{confidence!r}.npz"
    weights = _read(path, trials)
    if weights is None:
        weights = _simulate(trials, confidence)
        _write(path, weights)
        _forget_least_used(path.parent)
    for array in weights:
        array.setflags(write=False)
    return weights


def cache_folder() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "lm-tuner" / "tuning-curve-bands"


def _simulate(trials: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    lower, _, upper = EmpiricalDistribution.confidence_bands(
        np.arange(1.0, trials + 1), confidence, a=LOSS_FLOOR, method=BAND_METHOD,
        generator=np.random.default_rng(BAND_SEED), n_jobs=1)
    return np.asarray(lower.ws, dtype=float), np.asarray(upper.ws, dtype=float)  # already sorted: 0, 1 … n, inf


def _read(path: Path, trials: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The weights kept at `path`, or None where there are none or they are not whole (then they are made again)."""
    try:
        with np.load(path) as kept:
            lower, upper = kept["lower"], kept["upper"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        logger.warning("tuning-curve band cache: %s is unreadable (%s); computing the band again", path, error)
        return None
    whole = all(array.shape == (trials + 2,) and np.isclose(array.sum(), 1.0) for array in (lower, upper))
    if whole:
        with suppress(OSError):
            os.utime(path)  # used now: the last to be forgotten
    return (lower, upper) if whole else None


def _write(path: Path, weights: tuple[np.ndarray, np.ndarray]) -> None:
    """Kept for other processes; a folder that cannot be written costs only the time to compute them again."""
    part = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as file:
            part = Path(file.name)
            np.savez(file, lower=weights[0], upper=weights[1])
        os.replace(part, path)  # whole or absent to a reader in another process
    except OSError as error:
        if part is not None:
            part.unlink(missing_ok=True)
        logger.warning("tuning-curve band cache: cannot write %s (%s); the band will be computed again next time",
                       path, error)


def _forget_least_used(folder: Path) -> None:
    """Remove the least recently used weights beyond MAX_KEPT_FILES files or MAX_KEPT_BYTES (another process may
    be removing them too: a file gone already is passed over)."""
    found = []
    for entry in folder.glob("*.npz"):
        with suppress(OSError):
            status = entry.stat()
            found.append((status.st_mtime_ns, status.st_size, entry))
    kept_files = kept_bytes = 0
    for _, size, entry in sorted(found, key=lambda item: item[0], reverse=True):
        kept_files, kept_bytes = kept_files + 1, kept_bytes + size
        if kept_files > MAX_KEPT_FILES or kept_bytes > MAX_KEPT_BYTES:
            with suppress(OSError):
                entry.unlink()
