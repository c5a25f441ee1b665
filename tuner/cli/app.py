"""The `tuner` application: its commands, registered in the order `tuner --help` lists them."""

import sys
from importlib.metadata import version
from typing import Annotated

import typer

from lm_tuner.tuner.cli import manage, reading, running
from lm_tuner.tuner.cli.auth import auth_app, token_app
from lm_tuner.tuner.cli.common import command_group, options, print_error
from lm_tuner.tuner.cli.curves import curves
from lm_tuner.tuner.cli.data import data_app
from lm_tuner.tuner.cli.plan import plan
from lm_tuner.tuner.cli.serve import serve
from lm_tuner.tuner.cli.spaces import spaces_app
from lm_tuner.tuner.lifetime import freeze_loaded_objects
from lm_tuner.tuner.settings import SettingsError

app = command_group(
    help="Tune recurrent language models fairly: equal parameter budgets, Bayesian tuning, one database.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_app, name="data")
app.add_typer(token_app, name="token")
app.add_typer(auth_app, name="auth")
app.add_typer(spaces_app, name="spaces")


def _print_version(asked: bool) -> None:
    if asked:
        print(f"lm-tuner {version('lm-tuner')}")
        raise typer.Exit()


@app.callback()
def _global_options(
    debug: Annotated[bool, typer.Option("--debug", help="show the full traceback of an error instead of one line")]
    = False,
    _version: Annotated[bool, typer.Option("--version", help="print the installed version and exit",
                                           callback=_print_version, is_eager=True)] = False,
) -> None:
    options["debug"] = debug


for command in (plan, running.launch, running.resume, reading.status):
    app.command()(command)
app.command("list")(reading.list_command)
for command in (reading.best, reading.compare, curves, running.sensitivity, reading.export, manage.cancel,
                manage.delete):
    app.command()(command)
app.add_typer(manage.db_app, name="db")
app.add_typer(manage.kernels_app, name="kernels")
app.command()(serve)
app.command()(running.worker)


def main() -> None:
    try:
        app()
    except Exception as error:  # one line, the traceback with --debug
        if options["debug"]:
            raise
        if isinstance(error, SettingsError):  # an option's value: refused like a spec
            print_error(error)
            sys.exit(2)
        print_error(f"{type(error).__name__}: {error} (run with --debug for the traceback)")
        sys.exit(1)
    finally:
        # What is left is Python's finalization; exit handlers still run on frozen objects, Ray's shutdown among them.
        freeze_loaded_objects()
