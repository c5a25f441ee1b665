"""The `tuner` command line."""

import os

# Before numpy/torch load: one OpenMP thread keeps GP suggestions fast (trials set their own threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from lm_tuner.tuner.cli.auth import auth_app, token_app  # noqa: E402
from lm_tuner.tuner.cli.data import data_app  # noqa: E402
from lm_tuner.tuner.run.processes import adopt_orphans, stop_children, stop_on_signals, stop_signal  # noqa: E402
from lm_tuner.tuner.settings import ARTIFACTS_VARIABLE, HOME_VARIABLE, STORAGE_VARIABLE, Settings, SettingsError  # noqa: E402

if TYPE_CHECKING:
    from lm_tuner.tuner.spec import SpecError, StudySpec

TOKEN_VARIABLE = "LM_TUNER_API_TOKEN"  # the secret of `serve --initial-token`, e.g. from a deployment's secrets
WORKER_GRACE_SECONDS = 15  # `serve` waits this long for its worker to put its study back, then stops it

app = typer.Typer(
    help="Tune recurrent language models fairly: equal parameter budgets, Bayesian tuning, one database.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_app, name="data")
app.add_typer(token_app, name="token")
app.add_typer(auth_app, name="auth")
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False, soft_wrap=True)  # an error is one line, however wide
_options = {"debug": False}


@app.callback()
def _global_options(debug: Annotated[bool, typer.Option(
        "--debug", help="show the full traceback of an error instead of one line")] = False) -> None:
    _options["debug"] = debug

Storage = Annotated[Optional[str], typer.Option(
    "--storage", metavar="URL",
    help=f"SQLAlchemy URL of the database, e.g. postgresql://user@host/db [default: ${STORAGE_VARIABLE}, "
         f"else sqlite:///${HOME_VARIABLE}/tuner.db with {HOME_VARIABLE}=./lm-tuner-data]")]
Artifacts = Annotated[Optional[Path], typer.Option(
    "--artifacts", metavar="DIR",
    help=f"where checkpoints are written [default: ${ARTIFACTS_VARIABLE}, else ${HOME_VARIABLE}/artifacts]")]
JsonOutput = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]


@app.command()
def launch(
    space: Annotated[Path, typer.Option("--space", metavar="FILE", help="the study spec (YAML or JSON)")],
    storage: Storage = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option(
        "--address", help="Ray cluster to run trials on [default: start a local Ray]")] = None,
) -> None:
    """Run a study: every family tuned at the same parameter budget, trials run by Ray Tune.

    Launching a spec whose study exists (same name, identical spec) continues it.
    Exit status: 0 all trials ran, 1 the study stopped early, 2 the spec or study was refused,
    130 interrupted (Ctrl-C).
    """
    from lm_tuner.tuner.spec import SpecError, read_spec

    _quiet_libraries()
    try:
        spec, document = read_spec(space)
    except SpecError as error:
        _refuse_spec(error)
    settings = Settings.from_options(storage, artifacts, address)
    _run_study(spec, document, settings)


@app.command()
def resume(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option(
        "--address", help="Ray cluster to run trials on [default: start a local Ray]")] = None,
) -> None:
    """Continue a study from the database: trials left running by a stopped controller are marked
    failed (interrupted) and run again, until every family has its trials. Exit status as for launch."""
    settings = Settings.from_options(storage, artifacts, address)
    _run_study(*_stored_study(settings, name, missing_exit=2), settings)


def _run_study(spec: "StudySpec", document: str, settings: Settings) -> None:
    from lm_tuner.tuner.cli.progress import ProgressPrinter
    from lm_tuner.tuner.run.controller import StudyConflict, StudyRefused, launch_study

    console.print(
        f"[bold]{spec.name}[/bold]: {', '.join(spec.families)} at {spec.parameter_budget:,} parameters, "
        f"{spec.tuning.trials} trials per family, sampler {spec.tuning.sampler}, "
        f"{spec.tuning.concurrency} at a time\n[dim]database {settings.storage_url}\n"
        f"checkpoints {settings.artifact_root}[/dim]"
    )
    printer = ProgressPrinter(settings.storage_url, spec.name)
    try:
        with _stopping_cleanly():
            final = launch_study(spec, document, settings, callbacks=[printer])
    except (StudyConflict, StudyRefused) as error:
        _refuse(error)
    except KeyboardInterrupt:
        _exit_stopped(f"`tuner resume {spec.name}` (or the same launch) continues the study")
    _print_study(settings, spec.name)
    raise typer.Exit(0 if final == "complete" else 1)


@app.command()
def status(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """Show a study: trials by state per family, the best trials, the best possible perplexity if known."""
    settings = _settings_for_reading(storage)
    if not _print_study(settings, name, as_json=json_output):
        _no_such_study(settings, name, 1)


@app.command("list")
def list_command(storage: Storage = None, json_output: JsonOutput = False) -> None:
    """List studies, newest first."""
    from lm_tuner.api.schemas import StudyOut
    from lm_tuner.tuner.store.studies import list_studies

    settings = _settings_for_reading(storage)
    studies = list_studies(settings.storage_url).items
    if json_output:
        print(json.dumps([StudyOut.of(s).model_dump(mode="json") for s in studies], indent=2))
        return
    table = Table("study", "status", "families", "budget", "finished", "best val ppl")
    for study in studies:
        best = f"{study.best.perplexity:.3f} ({study.best.family})" if study.best else "-"
        table.add_row(study.name, study.status, ", ".join(study.families), f"{study.parameter_budget:,}",
                      f"{study.trials_finished}/{study.trials_expected}", best)
    console.print(table)


@app.command()
def best(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """The best complete trial of each family: value, hyperparameters, size and checkpoint."""
    from lm_tuner.api.schemas import TrialOut
    from lm_tuner.tuner.store.studies import best_trials

    settings = _settings_for_reading(storage)
    found = best_trials(settings.storage_url, name)
    if found is None:
        _no_such_study(settings, name, 1)
    if json_output:
        print(json.dumps({family: TrialOut.of(trial).model_dump(mode="json") if trial else None
                          for family, trial in found.items()}, indent=2))
        return
    for family, trial in found.items():
        if trial is None:
            console.print(f"[bold]{family}[/bold]: no complete trial yet")
            continue
        checkpoint = settings.artifact_root / trial.checkpoint.path if trial.checkpoint else "none"
        console.print(f"[bold]{family}[/bold] #{trial.number}: val ppl {trial.perplexity:.3f} "
                      f"(cross-entropy {trial.value:.4f} nats), {trial.parameter_count:,} parameters, "
                      f"hidden {trial.hidden_size}, seed {trial.seed}")
        for key, value in trial.params.items():
            console.print(f"    {key} = {value}")
        console.print(f"    checkpoint {checkpoint}")


@app.command()
def compare(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """The families side by side (Table 2.1 of the paper): best tuning run, then validation and test with
    and without MC dropout and dynamic evaluation, mean ± std over the reruns, and the winner."""
    from dataclasses import asdict

    from lm_tuner.tuner.analysis.comparison import comparison

    settings = _settings_for_reading(storage)
    found = comparison(settings.storage_url, name)
    if found is None:
        _no_such_study(settings, name, 1)
    if json_output:
        print(json.dumps(asdict(found), indent=2))
        return
    digits = 3 if found.unit == "bpc" else 2
    table = Table("family", "best tuning", "val", "test", "MC val", "MC test", "dyneval val", "dyneval test",
                  title=f"{found.study}: {found.unit}, mean ± std over the final models")

    def cell(estimate) -> str:
        if estimate is None:
            return "-"
        spread = f" ± {estimate.std:.{digits}f}" if estimate.count > 1 else ""
        return f"{estimate.mean:.{digits}f}{spread} (n={estimate.count})"

    for row in found.families:
        best = "-" if row.best_tuning is None else f"{row.best_tuning:.{digits}f}"
        table.add_row(row.family, best, cell(row.valid), cell(row.test), cell(row.mc_valid), cell(row.mc_test),
                      cell(row.dynamic_valid), cell(row.dynamic_test))
    console.print(table)
    if found.winner:
        console.print(f"winner: [bold]{found.winner}[/bold] (by the {found.winner_by})")


@app.command()
def sensitivity(
    name: Annotated[str, typer.Argument(help="study name")],
    parameter: Annotated[str, typer.Option("--parameter", "-p", metavar="P",
                                           help="the hyperparameter to move (one the family searched)")],
    seeds: Annotated[int, typer.Option(min=1, help="training seeds per moved value (new seeds, as reruns use)")] = 3,
    points: Annotated[int, typer.Option(min=2, help="moved values across best ± 15% of the range")] = 5,
    family: Annotated[Optional[str], typer.Option(help="the family whose best to move [default: the best family]")]
    = None,
    storage: Storage = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option(
        "--address", help="Ray cluster to run trials on [default: start a local Ray]")] = None,
) -> None:
    """Measure how sensitive the result is to one hyperparameter: train the best configuration again with P
    moved to POINTS values evenly across ±15% of its searched range around the best value (on the log scale
    for log-scaled ranges, clipped to the range), SEEDS seeds each, and print mean ± std of the validation
    score per value. Runs already made are reused. The dashboard plots the result at
    /dashboard/studies/NAME/sensitivity. Exit status: 0 done, 1 no such study, 2 a refused request."""
    from lm_tuner.tuner.analysis.sensitivity import (
        SensitivityError,
        measured_effect,
        plan_sensitivity,
        run_queued_sensitivity,
    )
    from lm_tuner.tuner.analysis.sensitivity import sensitivity_runs as runs_of
    from lm_tuner.tuner.run.controller import connect_ray

    settings = Settings.from_options(storage, artifacts, address)
    spec, _ = _stored_study(settings, name, missing_exit=1)
    try:
        plan = plan_sensitivity(settings.storage_url, name, parameter, seeds=seeds, points=points, family=family)
    except SensitivityError as error:
        _refuse(error)
    console.print(f"[bold]{name}[/bold]: {plan.family} trial {plan.best_trial_id} with {parameter} = "
                  f"{plan.best_value:.4g} moved to {', '.join(f'{v:.4g}' for v in plan.values)}; "
                  f"{len(plan.seeds)} seed(s) each, {plan.queued} new run(s)")
    try:
        with _stopping_cleanly():
            connect_ray(settings)
            run_queued_sensitivity(spec, settings)
    except KeyboardInterrupt:
        _exit_stopped("the same command continues the runs")
    effect = measured_effect(runs_of(settings.storage_url, name, parameter))
    table = Table(parameter, "mean", "std", "runs", title=f"{name} ({plan.family}): measured effect of {parameter}")
    for row in effect[effect["family"] == plan.family].itertuples():
        table.add_row(f"{row.value:.4g}", f"{row.mean:.3f}", f"{row.std:.3f}", str(row.count))
    console.print(table)


@app.command()
def export(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    output_format: Annotated[str, typer.Option("--format", help="csv or json")] = "csv",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write [default: stdout]")] = None,
) -> None:
    """Every trial of a study, one row each: family, state, value, perplexity, size, hyperparameters."""
    from lm_tuner.tuner.analysis.trial_frames import trials_table
    from lm_tuner.tuner.store.studies import get_study
    from lm_tuner.tuner.store.trials import study_trials

    if output_format not in ("csv", "json"):
        _refuse(f"--format: got {output_format!r}; allowed: csv, json")
    settings = _settings_for_reading(storage)
    if get_study(settings.storage_url, name) is None:
        _no_such_study(settings, name, 1)
    table = trials_table(study_trials(settings.storage_url, name).items)
    text = table.to_csv(index=False) if output_format == "csv" else table.to_json(orient="records", indent=2,
                                                                                 date_format="iso")
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        console.print(f"wrote {len(table)} trials to {output}")


@app.command()
def cancel(name: Annotated[str, typer.Argument(help="study name")], storage: Storage = None) -> None:
    """Cancel a study: a queued one at once, a running one within seconds (its running trials stop, are
    marked failed and interrupted, and run again if the study is resumed)."""
    from lm_tuner.tuner.store.lifecycle import StudyStateError, cancel_study

    settings = _settings_for_reading(storage)
    try:
        console.print(f"{name}: {cancel_study(settings.storage_url, name)}")
    except KeyError:
        _no_such_study(settings, name, 1)
    except StudyStateError as error:
        _refuse(error)


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    artifacts: Artifacts = None,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete a study that is not running, with its trials, learning curves and checkpoint files."""
    from lm_tuner.tuner.store.lifecycle import StudyStateError, delete_study

    settings = Settings.from_options(storage, artifacts)
    _settings_for_reading(storage)
    if not yes and not typer.confirm(f"Delete study {name!r} and its checkpoints?"):
        raise typer.Exit(1)
    try:
        delete_study(settings.storage_url, name, settings.artifact_root)
    except KeyError:
        _no_such_study(settings, name, 1)
    except StudyStateError as error:
        _refuse(error)
    console.print(f"deleted {name}")


db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(storage: Storage = None) -> None:
    """Create or migrate Optuna's and lm-tuner's tables to the installed version (safe to repeat).

    Run it once before starting several workers on a new PostgreSQL database."""
    from lm_tuner.tuner.store.engine import current_revision, ensure_schema

    settings = Settings.from_options(storage, None)
    ensure_schema(settings.storage_url)
    console.print(f"{settings.storage_url}: schema at revision {current_revision(settings.storage_url)}")


kernels_app = typer.Typer(help="The C++ kernels for recurrent layers on CPUs.", no_args_is_help=True)
app.add_typer(kernels_app, name="kernels")


@kernels_app.command("build")
def kernels_build() -> None:
    """Build the C++ kernels now (else the first trial on a CPU builds them, about 20 s) and print where they are.
    Exit status 1 where they cannot be built: trials on CPUs then take the slower PyTorch operations."""
    from lm_tuner.models import cpu_kernels

    directory = cpu_kernels.kernels_directory()
    try:
        module = cpu_kernels.load_or_build(directory)
    except Exception as error:  # no compiler, headers or ninja: several exception types
        _fail(f"the C++ kernels could not be built in {directory} ({error}); recurrent layers on CPUs take the "
              f"slower PyTorch operations", 1)
    console.print(module.__file__)


@app.command()
def serve(
    storage: Storage = None,
    artifacts: Artifacts = None,
    host: Annotated[str, typer.Option(help="interface to listen on (beyond this machine needs authentication on, "
                                           "or --insecure)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    worker: Annotated[bool, typer.Option(
        "--worker/--no-worker", help="also start a worker that runs studies submitted over REST")] = True,
    private_reads: Annotated[bool, typer.Option(
        "--private-reads", help="reads need a token too (the dashboard then has a sign-in page)")] = False,
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="listen beyond this machine with authentication off: anyone who reaches the port can "
                           "submit, cancel and delete studies")] = False,
    initial_token: Annotated[Optional[str], typer.Option(
        "--initial-token", metavar="NAME",
        help=f"on the first start (authentication off, no token NAME yet) create token NAME and turn "
             f"authentication on; its secret is ${TOKEN_VARIABLE} if set, else printed once")] = None,
) -> None:
    """Serve the REST API (OpenAPI at /docs) and the dashboard (at /dashboard).

    SIGINT or SIGTERM stops it cleanly: no new requests, the worker puts its study back in the queue (its
    running trials marked interrupted, to run again), every child process ends; exit status 0."""
    import uvicorn

    from lm_tuner.api.app import create_app
    from lm_tuner.tuner.store.engine import ensure_schema
    from lm_tuner.tuner.store.tokens import TokenError, auth_enabled
    from lm_tuner.tuner.store.tokens import initial_token as first_token

    settings = Settings.from_options(storage, artifacts, private_reads=private_reads)
    ensure_schema(settings.storage_url)
    if initial_token is not None:
        given = os.environ.get(TOKEN_VARIABLE) or None  # compose passes an unset variable as empty
        try:
            created = first_token(settings.storage_url, initial_token, given)
        except TokenError as error:
            _refuse(error)
        if created is not None:
            shown = f"its secret is ${TOKEN_VARIABLE}" if given else f"shown only this once: {created}"
            console.print(f"created API token {initial_token!r} and turned authentication on; {shown}")
    if not auth_enabled(settings.storage_url):
        if private_reads:
            _refuse("--private-reads: authentication is off; create a token first (`tuner token create NAME`)")
        if not _is_loopback(host) and not insecure:
            _refuse(f"--host {host}: listening beyond this machine with authentication off would let anyone who "
                    f"reaches port {port} submit, cancel and delete studies; create a token (`tuner token create "
                    f"NAME`), or pass --insecure")
    with _stopping_cleanly():
        runner = None
        if worker:
            runner = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner",
                                       "worker", "--storage", settings.storage_url,
                                       "--artifacts", str(settings.artifact_root)])
        console.print(f"dashboard: http://{host}:{port}/dashboard   API docs: http://{host}:{port}/docs")
        try:
            # uvicorn stops serving on SIGINT or SIGTERM, then raises the signal again: KeyboardInterrupt here.
            uvicorn.run(create_app(settings), host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
        except KeyboardInterrupt:
            pass
        finally:
            if runner is not None:
                _stop(runner, WORKER_GRACE_SECONDS)


@app.command()
def worker(
    storage: Storage = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster to run trials on")] = None,
    once: Annotated[bool, typer.Option("--once", help="exit when the queue is empty")] = False,
    poll_seconds: Annotated[float, typer.Option(help="how often to look for queued studies")] = 2.0,
) -> None:
    """Run studies submitted over REST (queued in the database), one at a time.

    SIGINT or SIGTERM stops it cleanly: the study it runs goes back to the queue (its running trials marked
    interrupted, to run again), every child process ends; exit status 0."""
    from lm_tuner.tuner.run.queue import run_worker

    _quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    settings = Settings.from_options(storage, artifacts, address)
    try:
        with _stopping_cleanly():
            run_worker(settings, poll_seconds=poll_seconds, once=once)
    except KeyboardInterrupt:
        logging.getLogger(__name__).info("worker stopped")


def _print_study(settings: Settings, name: str, *, as_json: bool = False) -> bool:
    from lm_tuner.api.schemas import StudyDetailOut, TrialOut
    from lm_tuner.tuner.store.studies import best_trials, family_counts, get_study
    from lm_tuner.tuner.store.trials import study_trials

    url = settings.storage_url
    study = get_study(url, name)
    if study is None:
        return False
    if as_json:
        payload = StudyDetailOut.of(study).model_dump(mode="json")
        payload["trials"] = [TrialOut.of(t).model_dump(mode="json") for t in study_trials(url, name).items]
        print(json.dumps(payload, indent=2))
        return True
    known = (f", best possible perplexity {study.best_possible_perplexity:.3f}"
             if study.best_possible_perplexity else "")
    console.print(f"\n[bold]{study.name}[/bold] ({study.status}) budget {study.parameter_budget:,} parameters{known}")
    if study.error:
        console.print(study.error, style="red", markup=False)  # stored text: never read as markup
    counts, best = family_counts(url, name), best_trials(url, name)
    per_family = Table("family", "complete", "pruned", "failed", "running", "best val ppl", "best trial")
    for family in study.families:
        top = best[family]
        per_family.add_row(family, *(str(counts[family][s]) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")),
                           f"{top.perplexity:.3f}" if top else "-", f"#{top.number}" if top else "-")
    console.print(per_family)
    ranked = study_trials(url, name, state="COMPLETE", sort="value", limit=5).items
    if ranked:
        table = Table("rank", "family", "trial", "val ppl", "parameters", "hidden", "hyperparameters")
        for rank, trial in enumerate(ranked, 1):
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
            table.add_row(str(rank), trial.family, f"#{trial.number}", f"{trial.perplexity:.3f}",
                          f"{trial.parameter_count:,}", str(trial.hidden_size), params)
        console.print(table)
    failed = study_trials(url, name, state="FAIL", limit=10)
    for trial in failed.items:
        console.print(f"{trial.family}#{trial.number} failed: {trial.fail_reason}", style="red", markup=False)
    if failed.total > len(failed.items):
        console.print(f"[red]... and {failed.total - len(failed.items)} more failed trials[/red]")
    return True


def _settings_for_reading(storage: str | None) -> Settings:
    from lm_tuner.tuner.store.engine import ensure_schema

    settings = Settings.from_options(storage, None)
    ensure_schema(settings.storage_url)
    return settings


@contextlib.contextmanager
def _stopping_cleanly() -> Iterator[None]:
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


def _stop(process: subprocess.Popen, grace_seconds: float) -> None:
    """Interrupt a child like Ctrl-C would (so it can put its study back in the queue), then kill it."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _exit_stopped(how_to_continue: str) -> NoReturn:
    """After a stop asked for by a signal: 130 for Ctrl-C (SIGINT), as shells expect; 0 for SIGTERM, the way
    service managers stop a process that then stopped cleanly."""
    received = stop_signal() or signal.SIGINT
    errors.print(f"stopped by {signal.Signals(received).name}: running trials were marked interrupted; "
                 f"{how_to_continue}", style="yellow", markup=False)
    raise typer.Exit(130 if received == signal.SIGINT else 0) from None


def _is_loopback(host: str) -> bool:
    """Whether every address `host` names is on this machine only (0.0.0.0 and :: are every interface)."""
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def _stored_study(settings: Settings, name: str, *, missing_exit: int) -> tuple["StudySpec", str]:
    """The stored spec and document of study `name` (the schema created if need be); exits if there is none."""
    from lm_tuner.tuner.run.queue import stored_spec
    from lm_tuner.tuner.store.engine import ensure_schema

    _quiet_libraries()
    ensure_schema(settings.storage_url)
    found = stored_spec(settings.storage_url, name)
    if found is None:
        _no_such_study(settings, name, missing_exit)
    return found


def _quiet_libraries() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _print_error(problem: object) -> None:
    """One line on stderr, whatever the problem's text."""
    errors.print("error: " + " ".join(str(problem).split()), style="red", markup=False)


def _fail(problem: object, exit_code: int) -> NoReturn:
    _print_error(problem)
    raise typer.Exit(exit_code)


def _refuse(problem: object) -> NoReturn:
    """A refused spec, request or option: exit status 2."""
    _fail(problem, 2)


def _refuse_spec(error: "SpecError", shown: int = 10) -> NoReturn:
    """The problems of a spec, one line each, with file, line and field (the first `shown` of them)."""
    for issue in error.issues[:shown]:
        _print_error(issue.render(error.source))
    if len(error.issues) > shown:
        _print_error(f"{error.source}: ... and {len(error.issues) - shown} more problems")
    raise typer.Exit(2)


def _no_such_study(settings: Settings, name: str, exit_code: int) -> NoReturn:
    _fail(f"no study named {name!r} in {settings.storage_url}", exit_code)


def main() -> None:
    try:
        app()
    except Exception as error:  # one line, the traceback with --debug
        if _options["debug"]:
            raise
        if isinstance(error, SettingsError):  # an option's value: refused like a spec
            _print_error(error)
            sys.exit(2)
        _print_error(f"{type(error).__name__}: {error} (run with --debug for the traceback)")
        sys.exit(1)
