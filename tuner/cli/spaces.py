"""`tuner spaces`: the study spaces shipped with lm-tuner, listed, shown and copied for editing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from lm_tuner.tuner.cli.common import PlainTable, command_group, console, fail
from lm_tuner.tuner.spec.shipped import ShippedSpace, UnknownSpace, shipped_space, shipped_spaces

spaces_app = command_group()

SpaceName = Annotated[str, typer.Argument(
    help="a shipped space, e.g. mogrifier_ptb or small/mogrifier_ptb (.yaml optional)")]


@spaces_app.callback(invoke_without_command=True)
def list_spaces(
    context: typer.Context,
    json_output: Annotated[bool, typer.Option(
        "--json", help="print a JSON list of {name, description} instead of a table")] = False,
) -> None:
    """The study spaces shipped with lm-tuner: the paper's experiments and their CPU-sized twins (small/...).

    Without a command, list them with their descriptions. Launch one by name (`tuner launch --space small/lstm_ptb`;
    a file of that name in the working directory is launched instead), print it (`tuner spaces show NAME`) or write
    an editable copy (`tuner spaces copy NAME`).
    """
    if context.invoked_subcommand is not None:
        return
    spaces = shipped_spaces()
    if json_output:
        print(json.dumps([{"name": space.name, "description": space.description} for space in spaces], indent=2))
        return
    table = PlainTable("space", "description", caption="tuner launch --space NAME runs one; tuner spaces copy NAME "
                                                   "writes an editable copy")
    table.columns[0].no_wrap = True
    for space in spaces:
        table.add_row(space.name, space.description)
    console.print(table)


@spaces_app.command()
def show(name: SpaceName) -> None:
    """Print a shipped space's YAML document exactly as shipped (comments included)."""
    sys.stdout.write(_shipped(name).text)


@spaces_app.command()
def copy(
    name: SpaceName,
    destination: Annotated[Optional[Path], typer.Argument(
        metavar="DEST", help="the file to write, or a folder to write it into; default: ./NAME.yaml in the working "
                             "directory (small/NAME: ./small_NAME.yaml)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite DEST if it exists")] = False,
) -> None:
    """Write an editable copy of a shipped space, then launch it with `tuner launch --space DEST`.

    Give a changed copy a new `name`: a launch continues the study of the same name only with an identical spec,
    and refuses a different one. Exit status: 0 written, 1 DEST exists (without --force) or cannot be written,
    2 no such space.
    """
    space = _shipped(name)
    target = _target(space, destination)
    try:
        with target.open("w" if force else "x", encoding="utf-8") as file:
            file.write(space.text)
    except FileExistsError:
        fail(f"{target} exists; pass --force to overwrite it, or name another DEST", 1)
    except OSError as error:
        fail(f"cannot write {target}: {error.strerror}", 1)
    console.print(f"wrote {target} (shipped space {space.name}); launch it with: tuner launch --space {target}",
                  markup=False)


def _target(space: ShippedSpace, destination: Path | None) -> Path:
    if destination is None:
        return Path(space.file_name)
    return destination / space.file_name if destination.is_dir() else destination


def _shipped(name: str) -> ShippedSpace:
    try:
        return shipped_space(name)
    except UnknownSpace as error:
        fail(error, 2)
