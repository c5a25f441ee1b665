"""Commands that change a study or the installation: `cancel`, `delete`, `db upgrade`, `kernels build`."""

from typing import Annotated

import typer

from lm_tuner.tuner.cli.common import (
    StorageOption,
    StudyArtifacts,
    command_group,
    console,
    fail,
    no_such_study,
    refuse,
    settings_for_reading,
)
from lm_tuner.tuner.settings import Settings, masked_url
from lm_tuner.tuner.store import Storage, study_artifacts


def cancel(name: Annotated[str, typer.Argument(help="study name")], storage: StorageOption = None) -> None:
    """Cancel a study: a queued one at once, a running one within seconds (its running trials stop, are
    marked failed and interrupted, and run again if the study is resumed)."""
    from lm_tuner.tuner.store import StudyStateError

    settings = settings_for_reading(storage)
    try:
        console.print(f"{name}: {Storage(settings.storage_url).cancel(name)}")
    except KeyError:
        no_such_study(settings, name, 1)
    except StudyStateError as error:
        refuse(error)


def delete(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    artifacts: StudyArtifacts = None,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete a study that is not running, with its trials, learning curves and checkpoint files (in the artifact
    store the study ran with, unless --artifacts names another)."""
    from lm_tuner.tuner.store import StudyStateError

    settings = Settings.from_options(storage, artifacts)
    settings_for_reading(storage)
    root = study_artifacts(settings, name, artifacts)
    if not yes and not typer.confirm(f"Delete study {name!r} and its checkpoints in {masked_url(root / name)}?"):
        raise typer.Exit(1)
    try:
        Storage(settings.storage_url).delete(name, root)
    except KeyError:
        no_such_study(settings, name, 1)
    except StudyStateError as error:
        refuse(error)
    console.print(f"deleted {name}")


db_app = command_group(help="The database schema.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(storage: StorageOption = None) -> None:
    """Create or migrate Optuna's and lm-tuner's tables to the installed version (safe to repeat).

    Run it once before starting several workers on a new PostgreSQL database."""
    settings = Settings.from_options(storage, None)
    database = Storage(settings.storage_url)
    database.upgrade()
    console.print(f"{masked_url(settings.storage_url)}: schema at revision {database.revision()}", markup=False)


kernels_app = command_group(help="The C++ kernels for recurrent layers on CPUs.", no_args_is_help=True)


@kernels_app.command("build")
def kernels_build() -> None:
    """Build the C++ kernels now (else a study builds them, about 20 s, before its first trial on a CPU) and say
    where they are and what they serve. Exit status 1 where they cannot be built: trials on CPUs then take the
    PyTorch operations."""
    import time

    from lm_tuner.models import cpu_kernels

    directory = cpu_kernels.kernels_directory()
    built_before, started = cpu_kernels.is_built(directory), time.perf_counter()
    try:
        module = cpu_kernels.load_or_build(directory)
    except Exception as error:  # no compiler, headers or ninja: several exception types
        fail(f"the C++ kernels could not be built in {directory} ({error}); recurrent layers on CPUs take the "
              f"slower PyTorch operations", 1)
    done = "already built" if built_before else f"built in {time.perf_counter() - started:.1f} s"
    typer.echo(f"C++ kernels for recurrent layers on CPUs: {done}\n{module.__file__}\n"
               f"What they are for: trials on CPUs compute LSTM, mLSTM and RLSTM layers (with or without a mogrifier) "
               f"with them, instead of the slower PyTorch operations. Every study and checkout with the same kernel "
               f"source, compiler and torch uses this build ($TORCH_EXTENSIONS_DIR, by default "
               f"~/.cache/torch_extensions).")
