"""The `tuner` command line."""

import os

# Before numpy/torch load: one OpenMP thread keeps GP suggestions fast (trials set their own threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Annotated, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tuner.data_cli import data_app  # noqa: E402
from tuner.settings import ARTIFACTS_VARIABLE, HOME_VARIABLE, STORAGE_VARIABLE, Settings  # noqa: E402

if TYPE_CHECKING:
    from tuner.spec import StudySpec

app = typer.Typer(
    help="Tune recurrent language models fairly: equal parameter budgets, Bayesian tuning, one database.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_app, name="data")
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

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
    from tuner.spec import SpecError, load_spec

    _quiet_libraries()
    try:
        spec = load_spec(space)
    except SpecError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    settings = Settings.from_options(storage, artifacts, address)
    _run_study(spec, space.read_text(), settings)


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
    from tuner.controller import StudyConflict, launch_study
    from tuner.progress import ProgressPrinter

    console.print(
        f"[bold]{spec.name}[/bold]: {', '.join(spec.families)} at {spec.parameter_budget:,} parameters, "
        f"{spec.tuning.trials} trials per family, sampler {spec.tuning.sampler}, "
        f"{spec.tuning.concurrency} at a time\n[dim]database {settings.storage_url}\n"
        f"checkpoints {settings.artifact_root}[/dim]"
    )
    printer = ProgressPrinter(settings.storage_url, spec.name)
    _stop_gracefully_on_signals()
    try:
        final = launch_study(spec, document, settings, callbacks=[printer])
    except StudyConflict as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    except KeyboardInterrupt:
        errors.print(f"[yellow]interrupted: running trials were marked failed (interrupted); run the same "
                     f"command again to continue study {spec.name!r}[/yellow]")
        raise typer.Exit(130) from None
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
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1)


@app.command("list")
def list_command(storage: Storage = None, json_output: JsonOutput = False) -> None:
    """List studies, newest first."""
    from api.schemas import StudyOut
    from tuner.results import list_studies

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
    from api.schemas import TrialOut
    from tuner.results import best_trials

    settings = _settings_for_reading(storage)
    found = best_trials(settings.storage_url, name)
    if found is None:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1)
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

    from tuner.comparison import comparison

    settings = _settings_for_reading(storage)
    found = comparison(settings.storage_url, name)
    if found is None:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1)
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
    from tuner.controller import connect_ray
    from tuner.sensitivity import SensitivityError, measured_effect, plan_sensitivity, run_queued_sensitivity
    from tuner.sensitivity import sensitivity_runs as runs_of

    settings = Settings.from_options(storage, artifacts, address)
    spec, _ = _stored_study(settings, name, missing_exit=1)
    try:
        plan = plan_sensitivity(settings.storage_url, name, parameter, seeds=seeds, points=points, family=family)
    except SensitivityError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    console.print(f"[bold]{name}[/bold]: {plan.family} trial {plan.best_trial_id} with {parameter} = "
                  f"{plan.best_value:.4g} moved to {', '.join(f'{v:.4g}' for v in plan.values)}; "
                  f"{len(plan.seeds)} seed(s) each, {plan.queued} new run(s)")
    connect_ray(settings)
    run_queued_sensitivity(spec, settings)
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
    from tuner.results import get_study, study_trials, trials_table

    if output_format not in ("csv", "json"):
        errors.print(f"[red]--format: got {output_format!r}; allowed: csv, json[/red]")
        raise typer.Exit(2)
    settings = _settings_for_reading(storage)
    if get_study(settings.storage_url, name) is None:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1)
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
    from tuner.lifecycle import StudyStateError, cancel_study

    settings = _settings_for_reading(storage)
    try:
        console.print(f"{name}: {cancel_study(settings.storage_url, name)}")
    except KeyError:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1) from None
    except StudyStateError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    artifacts: Artifacts = None,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
) -> None:
    """Delete a study that is not running, with its trials, learning curves and checkpoint files."""
    from tuner.lifecycle import StudyStateError, delete_study

    settings = Settings.from_options(storage, artifacts)
    _settings_for_reading(storage)
    if not yes and not typer.confirm(f"Delete study {name!r} and its checkpoints?"):
        raise typer.Exit(1)
    try:
        delete_study(settings.storage_url, name, settings.artifact_root)
    except KeyError:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1) from None
    except StudyStateError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    console.print(f"deleted {name}")


db_app = typer.Typer(help="The database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(storage: Storage = None) -> None:
    """Create or migrate Optuna's and lm-tuner's tables to the installed version (safe to repeat).

    Run it once before starting several workers on a new PostgreSQL database."""
    from tuner.db import current_revision, ensure_schema

    settings = Settings.from_options(storage, None)
    ensure_schema(settings.storage_url)
    console.print(f"{settings.storage_url}: schema at revision {current_revision(settings.storage_url)}")


token_app = typer.Typer(help="Bearer tokens for the REST API: once one exists, every write needs one.",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(name: Annotated[str, typer.Argument(help="who or what the token is for")],
                 storage: Storage = None) -> None:
    """Create a token and print it (it is stored hashed: this is the only time it is shown)."""
    from tuner.tokens import TokenError, create_token

    settings = _settings_for_reading(storage)
    try:
        print(create_token(settings.storage_url, name))
    except TokenError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="the token's name")], storage: Storage = None) -> None:
    """Revoke a token; requests carrying it are refused from now on."""
    from tuner.tokens import TokenError, revoke_token

    settings = _settings_for_reading(storage)
    try:
        revoke_token(settings.storage_url, name)
    except TokenError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    console.print(f"revoked {name}")


@token_app.command("list")
def token_list(storage: Storage = None) -> None:
    """Tokens by name, with when they were created and revoked."""
    from tuner.tokens import list_tokens

    table = Table("name", "created", "revoked")
    for token in list_tokens(_settings_for_reading(storage).storage_url):
        table.add_row(token.name, str(token.created_at), str(token.revoked_at or "-"))
    console.print(table)


@app.command()
def serve(
    storage: Storage = None,
    artifacts: Artifacts = None,
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    worker: Annotated[bool, typer.Option(
        "--worker/--no-worker", help="also start a worker that runs studies submitted over REST")] = True,
    private_reads: Annotated[bool, typer.Option(
        "--private-reads", help="reads need a bearer token too (once any token exists)")] = False,
) -> None:
    """Serve the REST API (OpenAPI at /docs) and the dashboard (at /dashboard)."""
    import uvicorn

    from api.app import create_app

    settings = Settings.from_options(storage, artifacts, private_reads=private_reads)
    runner = None
    if worker:
        runner = subprocess.Popen([sys.executable, "-m", "tuner", "worker", "--storage", settings.storage_url,
                                   "--artifacts", str(settings.artifact_root)])
    console.print(f"dashboard: http://{host}:{port}/dashboard   API docs: http://{host}:{port}/docs")
    try:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
    finally:
        if runner is not None:
            _stop(runner)


@app.command()
def worker(
    storage: Storage = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster to run trials on")] = None,
    once: Annotated[bool, typer.Option("--once", help="exit when the queue is empty")] = False,
    poll_seconds: Annotated[float, typer.Option(help="how often to look for queued studies")] = 2.0,
) -> None:
    """Run studies submitted over REST (queued in the database), one at a time."""
    from tuner.queue import run_worker

    _quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    settings = Settings.from_options(storage, artifacts, address)
    _stop_gracefully_on_signals()
    try:
        run_worker(settings, poll_seconds=poll_seconds, once=once)
    except KeyboardInterrupt:
        logging.getLogger(__name__).info("worker stopped")


def _print_study(settings: Settings, name: str, *, as_json: bool = False) -> bool:
    from api.schemas import StudyDetailOut, TrialOut
    from tuner.results import best_trials, family_counts, get_study, study_trials

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
        console.print(f"[red]{study.error}[/red]")
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
        console.print(f"[red]{trial.family}#{trial.number} failed: {trial.fail_reason}[/red]")
    if failed.total > len(failed.items):
        console.print(f"[red]... and {failed.total - len(failed.items)} more failed trials[/red]")
    return True


def _settings_for_reading(storage: str | None) -> Settings:
    from tuner.db import ensure_schema

    settings = Settings.from_options(storage, None)
    ensure_schema(settings.storage_url)
    return settings


def _stop_gracefully_on_signals() -> None:
    """SIGINT and SIGTERM (until Ray takes SIGTERM over) raise KeyboardInterrupt, which puts running work
    back in order. Set explicitly: a command started in the background of a script inherits SIGINT ignored."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.default_int_handler)


def _stop(process: subprocess.Popen, grace_seconds: float = 60) -> None:
    """Interrupt a child like Ctrl-C would (so it can put its study back in the queue), then kill it.
    (SIGINT, not SIGTERM: once Ray runs in a process, Ray's own SIGTERM handler takes over.)"""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _stored_study(settings: Settings, name: str, *, missing_exit: int) -> tuple["StudySpec", str]:
    """The stored spec and document of study `name` (the schema created if need be); exits if there is none."""
    from tuner.db import ensure_schema
    from tuner.queue import stored_spec

    _quiet_libraries()
    ensure_schema(settings.storage_url)
    found = stored_spec(settings.storage_url, name)
    if found is None:
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(missing_exit)
    return found


def _quiet_libraries() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def main() -> None:
    app()
