"""Every command's --help is written the conventional way: a flag shows no value type (Typer 0.29 writes `<bool>`
beside it), and a required argument reads NAME, in the usage line as in errors (Typer writes `{name}`)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import typer
from typer.testing import CliRunner

from lm_tuner.tuner.cli.app import app


def command_paths(group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from command_paths(command, (*path, name))


def test_no_command_s_help_shows_bool_beside_a_flag_or_braces_around_an_argument():
    paths = list(command_paths(typer.main.get_command(app)))
    assert ("status",) in paths and ("token", "create") in paths and len(paths) > 20
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        usage = next(line for line in result.output.splitlines() if "Usage:" in line)
        assert "<bool>" not in result.output and "{" not in usage, (path, result.output)
    status = CliRunner().invoke(app, ["status", "--help"], env={"COLUMNS": "200"}).output
    assert "status [OPTIONS] NAME" in status and re.search(r"--json\s+print machine-readable", status)
    missing = CliRunner().invoke(app, ["status"], env={"COLUMNS": "200"})
    assert missing.exit_code == 2 and "Missing argument 'NAME'" in missing.output
