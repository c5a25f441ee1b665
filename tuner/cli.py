"""The `tuner` command line."""

import os

# Before numpy/torch load: one OpenMP thread keeps GP suggestions fast (trials set their own threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tuner.data_cli import data_app  # noqa: E402
from tuner.settings import ARTIFACTS_VARIABLE, HOME_VARIABLE, STORAGE_VARIABLE, Settings  # noqa: E402

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
    Exit status: 0 all trials ran, 1 the study stopped early, 2 the spec or study was refused.
    """
    from tuner.controller import StudyConflict, launch_study
    from tuner.progress import ProgressPrinter
    from tuner.spec import SpecError, load_spec

    _quiet_libraries()
    try:
        spec = load_spec(space)
    except SpecError as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    settings = Settings.from_options(storage, artifacts, address)
    console.print(
        f"[bold]{spec.name}[/bold]: {', '.join(spec.families)} at {spec.parameter_budget:,} parameters, "
        f"{spec.tuning.trials} trials per family, sampler {spec.tuning.sampler}, "
        f"{spec.tuning.concurrency} at a time\n[dim]database {settings.storage_url}\n"
        f"checkpoints {settings.artifact_root}[/dim]"
    )
    printer = ProgressPrinter(settings.storage_url, spec.name, spec.tuning.trials * len(spec.families))
    try:
        final = launch_study(spec, space.read_text(), settings, callbacks=[printer])
    except StudyConflict as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from error
    _print_study(settings, spec.name)
    raise typer.Exit(0 if final == "complete" else 1)


@app.command()
def status(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """Show a study: trials by state per family, the best trials, the best possible perplexity if known."""
    settings = Settings.from_options(storage, None)
    from tuner.db import ensure_schema

    ensure_schema(settings.storage_url)
    if not _print_study(settings, name, as_json=json_output):
        errors.print(f"[red]no study named {name!r} in {settings.storage_url}[/red]")
        raise typer.Exit(1)


@app.command("list")
def list_command(storage: Storage = None, json_output: JsonOutput = False) -> None:
    """List studies, newest first."""
    from api.schemas import StudyOut
    from tuner.db import ensure_schema
    from tuner.results import list_studies

    settings = Settings.from_options(storage, None)
    ensure_schema(settings.storage_url)
    studies = list_studies(settings.storage_url)
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
def serve(
    storage: Storage = None,
    artifacts: Artifacts = None,
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    worker: Annotated[bool, typer.Option(
        "--worker/--no-worker", help="also start a worker that runs studies submitted over REST")] = True,
) -> None:
    """Serve the REST API (OpenAPI at /docs) and the dashboard (at /dashboard)."""
    import uvicorn

    from api.app import create_app

    settings = Settings.from_options(storage, artifacts)
    runner = None
    if worker:
        runner = subprocess.Popen([sys.executable, "-m", "tuner", "worker", "--storage", settings.storage_url,
                                   "--artifacts", str(settings.artifact_root)])
    console.print(f"dashboard: http://{host}:{port}/dashboard   API docs: http://{host}:{port}/docs")
    try:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
    finally:
        if runner is not None:
            runner.terminate()
            runner.wait(timeout=30)


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
    try:
        run_worker(settings, poll_seconds=poll_seconds, once=once)
    except KeyboardInterrupt:
        pass


def _print_study(settings: Settings, name: str, *, as_json: bool = False) -> bool:
    from api.schemas import StudyDetailOut
    from tuner.results import get_study, study_trials

    study = get_study(settings.storage_url, name)
    if study is None:
        return False
    trials = study_trials(settings.storage_url, name)
    if as_json:
        payload = StudyDetailOut.of(study).model_dump(mode="json")
        payload["trials"] = [{"trial_id": t.trial_id, "family": t.family, "number": t.number, "state": t.state,
                              "value": t.value, "params": t.params} for t in trials]
        print(json.dumps(payload, indent=2))
        return True
    known = (f", best possible perplexity {study.best_possible_perplexity:.3f}"
             if study.best_possible_perplexity else "")
    console.print(f"\n[bold]{study.name}[/bold] ({study.status}) budget {study.parameter_budget:,} parameters{known}")
    if study.error:
        console.print(f"[red]{study.error}[/red]")
    per_family = Table("family", "complete", "pruned", "failed", "running", "best val ppl", "best trial")
    for family in study.families:
        own = [t for t in trials if t.family == family]
        done = [t for t in own if t.value is not None]
        best = min(done, key=lambda t: t.value) if done else None
        per_family.add_row(family, *(str(sum(t.state == s for t in own)) for s in ("COMPLETE", "PRUNED", "FAIL",
                                                                                     "RUNNING")),
                           f"{best.perplexity:.3f}" if best else "-", f"#{best.number}" if best else "-")
    console.print(per_family)
    ranked = sorted((t for t in trials if t.value is not None), key=lambda t: t.value)[:5]
    if ranked:
        top = Table("rank", "family", "trial", "val ppl", "parameters", "hidden", "hyperparameters")
        for rank, trial in enumerate(ranked, 1):
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
            top.add_row(str(rank), trial.family, f"#{trial.number}", f"{trial.perplexity:.3f}",
                        f"{trial.parameter_count:,}", str(trial.hidden_size), params)
        console.print(top)
    for trial in trials:
        if trial.fail_reason:
            console.print(f"[red]{trial.family}#{trial.number} failed: {trial.fail_reason}[/red]")
    return True


def _quiet_libraries() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def main() -> None:
    app()
