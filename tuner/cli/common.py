"""What every command shares: the consoles, the common options, one-line errors and exit codes, reading
settings and stored studies, and stopping cleanly on a signal."""

import contextlib
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from lm_tuner.tuner.cli.help_format import ConventionalTyper
from lm_tuner.tuner.run.processes import adopt_orphans, stop_children, stop_on_signals, stop_signal
from lm_tuner.tuner.settings import (
    ARTIFACTS_VARIABLE,
    HOME_VARIABLE,
    STORAGE_VARIABLE,
    Settings,
    masked_url,
)
from lm_tuner.tuner.store import Storage

if TYPE_CHECKING:
    from lm_tuner.tuner.spec import SpecError, StudySpec
    from lm_tuner.tuner.spec.units import Unit


console = Console(highlight=False)


errors = Console(stderr=True, highlight=False, soft_wrap=True)  # an error is one line, however wide


options = {"debug": False}


StorageOption = Annotated[Optional[str], typer.Option(
    "--storage", metavar="URL",
    help=f"SQLAlchemy URL of the database, e.g. postgresql://user@host/db; a URL with a password belongs in "
         f"${STORAGE_VARIABLE}, since every user of this machine can read a command line [default: "
         f"${STORAGE_VARIABLE}, else sqlite:///${HOME_VARIABLE}/tuner.db, {HOME_VARIABLE} by default this user's "
         f"data folder, ~/.local/share/lm-tuner]")]


Artifacts = Annotated[Optional[str], typer.Option(  # a string: a Path would turn s3://b/p into the folder s3:/b/p
    "--artifacts", metavar="DIR|URL",
    help=f"where checkpoints are written: a folder, or an object-store URL such as s3://bucket/prefix "
         f"(docs/cluster.md) [default: ${ARTIFACTS_VARIABLE}, else ${HOME_VARIABLE}/artifacts]")]
StudyArtifacts = Annotated[Optional[str], typer.Option(
    "--artifacts", metavar="DIR|URL",
    help=f"the study's checkpoints: a folder, or an object-store URL such as s3://bucket/prefix (docs/cluster.md) "
         f"[default: the store the study ran with, else ${ARTIFACTS_VARIABLE}, else ${HOME_VARIABLE}/artifacts]")]


Address = Annotated[Optional[str], typer.Option(
    "--address", help="Ray cluster to run trials on [default: start a local Ray]")]
JsonOutput = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]


def settings_for_reading(storage: str | None) -> Settings:

    settings = Settings.from_options(storage, None)
    Storage(settings.storage_url).upgrade()
    return settings


@contextlib.contextmanager
def stopping_cleanly() -> Iterator[None]:
    """Around work that starts processes (Ray, trials, a worker): SIGINT and SIGTERM raise KeyboardInterrupt, and
    whatever way the work ends, no process it started is left running."""
    adopt_orphans()
    stop_on_signals()
    try:
        yield
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        stop_children()


def stop_process(process: subprocess.Popen, grace_seconds: float) -> None:
    """Ask a child command to stop (SIGTERM: it puts its study back in the queue, as on Ctrl-C; one still starting
    ends at once, where SIGINT would print a KeyboardInterrupt traceback from its imports), then kill it."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def exit_stopped(how_to_continue: str) -> NoReturn:
    """After a stop asked for by a signal: 130 for Ctrl-C (SIGINT), as shells expect; 0 for SIGTERM, the way
    service managers stop a process that then stopped cleanly."""
    received = stop_signal() or signal.SIGINT
    errors.print(f"stopped by {signal.Signals(received).name}: running trials were marked interrupted; "
                 f"{how_to_continue}", style="yellow", markup=False)
    raise typer.Exit(130 if received == signal.SIGINT else 0) from None


def stored_study(settings: Settings, name: str, *, missing_exit: int) -> tuple["StudySpec", str]:
    """The stored spec and document of study `name` (the schema created if need be); exits if there is none."""
    from lm_tuner.tuner.run.queue import stored_spec

    quiet_libraries()
    Storage(settings.storage_url).upgrade()
    found = stored_spec(settings.storage_url, name)
    if found is None:
        no_such_study(settings, name, missing_exit)
    return found


def quiet_libraries() -> None:
    """Libraries' own reports off (their warnings and errors kept); before anything imports ray.tune."""
    import optuna

    from lm_tuner.tuner.run.ray_quiet import quiet_environment

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    quiet_environment()


def print_error(problem: object) -> None:
    """One line on stderr, whatever the problem's text."""
    errors.print("error: " + " ".join(str(problem).split()), style="red", markup=False)


def fail(problem: object, exit_code: int) -> NoReturn:
    print_error(problem)
    raise typer.Exit(exit_code)


def refuse(problem: object) -> NoReturn:
    """A refused spec, request or option: exit status 2."""
    fail(problem, 2)


def output_file(path: Path, option: str) -> Path:
    """`path`, checked before any work is done: not a folder, its folder made where missing, and written there for
    real (a file it may replace, else a folder it may add to); else a refusal naming `option`."""
    if path.is_dir():
        refuse(f"{option}: {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        refuse(f"{option}: cannot make the folder {path.parent} ({error.strerror})")
    try:
        if path.exists():
            path.open("ab").close()  # appending nothing leaves its content as it is
        else:
            _try_writing_in(path.parent)
    except OSError as error:
        refuse(f"{option}: cannot write {path} ({error.strerror})")
    return path


def output_folder(path: Path, option: str) -> Path:
    """`path` as a folder to write into, made where missing, before any work is done; else a refusal naming
    `option`."""
    if path.exists() and not path.is_dir():
        refuse(f"{option}: {path} is a file; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        refuse(f"{option}: cannot make the folder {path} ({error.strerror})")
    try:
        _try_writing_in(path)
    except OSError as error:
        refuse(f"{option}: cannot write in the folder {path} ({error.strerror})")
    return path


def _try_writing_in(folder: Path) -> None:
    """Raises OSError where no file can be made in `folder`. Its permission bits cannot tell: root passes them, and a
    folder of a special filesystem (/proc, a read-only mount) may allow no new file whatever they say."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".lm-tuner-probe-"):
        pass


def refuse_spec(error: "SpecError", shown: int = 10) -> NoReturn:
    """The problems of a spec, one line each, with file, line and field (the first `shown` of them)."""
    for issue in error.issues[:shown]:
        print_error(issue.render(error.source))
    if len(error.issues) > shown:
        print_error(f"{error.source}: ... and {len(error.issues) - shown} more problems")
    raise typer.Exit(2)


def no_such_study(settings: Settings, name: str, exit_code: int) -> NoReturn:
    fail(f"no study named {name!r} in {masked_url(settings.storage_url)}", exit_code)


def command_group(**options: Any) -> typer.Typer:
    """A Typer app whose help texts are read as Markdown: a paragraph's lines are joined and refolded to the terminal,
    and a "[default: ...]" in an option's help is shown, where Rich markup (Typer's default) would take it for a
    style tag and drop it."""
    return ConventionalTyper(rich_markup_mode="markdown", **options)


class PlainTable(Table):
    """A table whose cells are shown as written: a category, a path or a description with brackets in it is not
    read as console markup (titles and headers still are)."""

    def add_row(self, *cells: RenderableType | None, **options: Any) -> None:
        super().add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells), **options)


def unclipped(table: Table) -> Table:
    """A table that folds what does not fit rather than cutting it ("…"), its first column (names) kept whole."""
    for column in table.columns:
        column.overflow = "fold"
    table.columns[0].no_wrap = True
    return table


def score_name(unit: "Unit") -> str:
    """How a column or a line names a study's validation score: `val ppl` or `val bpc`."""
    return "val ppl" if unit.name == "perplexity" else "val bpc"


def duration_text(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
