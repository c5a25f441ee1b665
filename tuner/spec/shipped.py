"""The study spaces shipped with lm-tuner (package data of lm_tuner.spaces), found by name from anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import yaml

from lm_tuner.tuner.spec.spec_file import NotARegularFile, refuse_special

if TYPE_CHECKING:
    from lm_tuner.tuner.spec.document import StudySpec

SPACES_PACKAGE = "lm_tuner.spaces"
SUFFIX = ".yaml"
SUBFOLDERS = ("small",)  # spaces/small/ holds the CPU-sized twins


class UnknownSpace(ValueError):
    """Neither a file nor the name of a shipped space."""


@dataclass(frozen=True)
class ShippedSpace:
    name: str  # "mogrifier_ptb", "small/mogrifier_ptb"
    description: str  # the document's `description` field ("" where it has none)
    text: str

    @property
    def file_name(self) -> str:
        """The name an editable copy gets: "mogrifier_ptb.yaml", and "small_mogrifier_ptb.yaml" for
        "small/mogrifier_ptb" (a twin's copy named like the full space would be launched in its place by that name)."""
        return "_".join(PurePosixPath(self.name).parts) + SUFFIX


@dataclass(frozen=True)
class ResolvedSpace:
    """Where a `--space` argument led: a local file, or a shipped space."""

    source: str  # names it in messages: the file's path, or "shipped space small/mogrifier_ptb"
    path: Path | None  # the local file; None for a shipped space
    shipped: ShippedSpace | None  # the shipped space; None for a local file

    def read(self) -> tuple[StudySpec, str]:
        """The spec validated, with its text; a SpecError names `source`. A local file goes through read_spec, which
        reads a bounded amount of text only: a user may point at anything."""
        from lm_tuner.tuner.spec.validation import parse_spec, read_spec  # loads the families; listing spaces need not

        if self.path is not None:
            return read_spec(self.path)
        return parse_spec(self.shipped.text, source=self.source), self.shipped.text


def shipped_spaces() -> list[ShippedSpace]:
    """Every shipped space: the full-size ones first, then the CPU-sized twins (small/...), each by name."""
    return [_load(name, file) for name, file in _shipped_files().items()]


def shipped_names() -> list[str]:
    return list(_shipped_files())


def shipped_space(name: str) -> ShippedSpace:
    """The shipped space `name`, given as "mogrifier_ptb", "mogrifier_ptb.yaml", "small/mogrifier_ptb" or
    "small/mogrifier_ptb.yaml". Never a file outside the package: raises UnknownSpace for anything else."""
    known = _shipped_files()
    parts = PurePosixPath(name.removesuffix(SUFFIX)).parts
    if not parts or name.startswith("/") or ".." in parts:
        raise UnknownSpace(f"{name!r} is not the name of a shipped space (a name is relative, without '..'); "
                           f"shipped spaces: {', '.join(known)}; `tuner spaces` describes them")
    key = "/".join(parts)
    if key not in known:
        raise UnknownSpace(f"no shipped space {name!r}; shipped spaces: {', '.join(known)}; "
                           f"`tuner spaces` describes them")
    return _load(key, known[key])


def resolve_space(argument: str, *, cwd: Path | None = None) -> ResolvedSpace:
    """A `--space` argument: an existing path (relative to `cwd`, else the working directory, or absolute) first,
    so a local file named like a shipped space wins; else the name of a shipped space (see shipped_space). A path
    that is not a regular file (a folder, a FIFO, a device, a socket) is refused (UnknownSpace) before anything
    opens it."""
    path = Path(argument)
    located = path if cwd is None else cwd / path  # an absolute `path` stays itself
    if located.exists():
        try:
            refuse_special(located)
        except NotARegularFile as error:
            raise UnknownSpace(f"{argument!r} is {error.kind}, not a file; give a study spec (a YAML or JSON file) "
                               f"or the name of a shipped space (`tuner spaces` lists them)") from None
        return ResolvedSpace(source=str(located), path=located, shipped=None)
    try:
        space = shipped_space(argument)
    except UnknownSpace:
        raise UnknownSpace(f"no such file or shipped space: {argument!r}; shipped spaces: "
                           f"{', '.join(shipped_names())}; `tuner spaces` describes them") from None
    return ResolvedSpace(source=f"shipped space {space.name}", path=None, shipped=space)


def _shipped_files() -> dict[str, Traversable]:
    root = files(SPACES_PACKAGE)
    found: dict[str, Traversable] = {}
    for prefix, folder in (("", root), *((f"{sub}/", root / sub) for sub in SUBFOLDERS)):
        for file in sorted(folder.iterdir(), key=lambda entry: entry.name):
            if file.is_file() and file.name.endswith(SUFFIX):
                found[prefix + file.name.removesuffix(SUFFIX)] = file
    return found


def _load(name: str, file: Traversable) -> ShippedSpace:
    text = file.read_text(encoding="utf-8")
    description = yaml.safe_load(text).get("description") or ""
    return ShippedSpace(name=name, description=str(description), text=text)
