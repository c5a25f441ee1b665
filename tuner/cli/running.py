"""Commands that run trials: `launch`, `resume`, `sensitivity` and `worker`."""

import logging
from functools import partial
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from lm_tuner.tuner.cli.common import (
    Address,
    Artifacts,
    PlainTable,
    StorageOption,
    StudyArtifacts,
    console,
    exit_stopped,
    quiet_libraries,
    refuse,
    refuse_spec,
    stopping_cleanly,
    stored_study,
)
from lm_tuner.tuner.cli.reading import print_study
from lm_tuner.tuner.settings import RAY_IDLE_SECONDS, Settings, masked_url
from lm_tuner.tuner.store import Storage, in_study_store

if TYPE_CHECKING:
    from lm_tuner.tuner.cli.live_display import ProgressDisplay
    from lm_tuner.tuner.spec import StudySpec

DEBUG_VARIABLE = "LM_TUNER_DEBUG"  # `tuner worker --debug`, set by `tuner serve --debug` for its worker


def launch(
    space: Annotated[str, typer.Option(
        "--space", metavar="FILE|NAME",
        help="the study spec (YAML or JSON): a file, else a shipped space by name (mogrifier_ptb.yaml, mogrifier_ptb, "
             "small/mogrifier_ptb; `tuner spaces` lists them)")],
    storage: StorageOption = None,
    artifacts: StudyArtifacts = None,
    address: Address = None,
) -> None:
    """Run a study: every family tuned at the same parameter budget, trials run by Ray Tune.

    Launching a spec whose study exists (same name, identical spec) continues it. The warnings of `tuner plan`
    (without its probe) are printed before the trials start; a study that cannot learn its task (a reverse-copy
    example longer than a training window) is refused. Before the warnings, the study's cost: GPU-hours or core-hours
    and its duration on this machine, from a FLOP count (`tuner plan` times it with its probe), with a note where it
    is more than a day.
    Exit status: 0 all trials ran, 1 the study stopped early, 2 the spec or study was refused,
    130 interrupted (Ctrl-C).
    """
    from lm_tuner.tuner.spec import SpecError
    from lm_tuner.tuner.spec.feasibility import task_issues
    from lm_tuner.tuner.spec.shipped import UnknownSpace, resolve_space

    quiet_libraries()
    try:
        resolved = resolve_space(space)
        spec, document = resolved.read()
        if impossible := task_issues(spec):
            raise SpecError(impossible, resolved.source)
    except UnknownSpace as error:  # before SpecError's ValueError
        refuse(f"--space: {error}")
    except SpecError as error:
        refuse_spec(error)
    settings = Settings.from_options(storage, artifacts, address)
    vocab_size = _vocabulary_size_or_refuse(spec)
    quiet_libraries()
    Storage(settings.storage_url).upgrade()
    _run_study(spec, document, in_study_store(settings, spec.name, artifacts), vocab_size=vocab_size)


def _vocabulary_size_or_refuse(spec: "StudySpec") -> int:
    """The size of the corpus's vocabulary (read now; the launch reuses the corpus). Data that cannot be read, or a
    budget that fits no model, refuses the study here, as the launch would."""
    from lm_tuner.tuner.run.controller import StudyRefused, prepared_corpus

    try:
        return len(prepared_corpus(spec).vocabulary)
    except StudyRefused as error:
        refuse(error)


def _trials_said(spec: "StudySpec") -> str:
    budget = spec.compute_budget
    if budget is None:
        return f"{spec.tuning.trials} trials per family"
    return (f"a compute budget ({budget.rungs} rung(s) of successive halving, {spec.tuning.trials} configurations "
            f"per family)")


def _print_warnings(spec: "StudySpec", vocab_size: int, display: "ProgressDisplay", url: str | None = None) -> None:
    """The study's cost (from a FLOP count; a compute budget's split, as its first run fixed it) and the plan's
    warnings (working them out takes about 1.5 s: the launch does it while Ray starts, before the first trial)."""
    from lm_tuner.tuner.cli.budget_report import budget_line
    from lm_tuner.tuner.run.budgeting import stored_budget_plan
    from lm_tuner.tuner.run.machine import this_machine
    from lm_tuner.tuner.run.study_data import corpus_size, data_warnings
    from lm_tuner.tuner.spec.cost import with_counted_cost
    from lm_tuner.tuner.spec.plan import plan_study

    planned = plan_study(spec, vocab_size)
    budget = stored_budget_plan(url, spec.name) if url is not None and spec.compute_budget is not None else None
    if budget is not None:
        display.print(escape(budget_line(budget)))
    else:
        cost = with_counted_cost(spec, planned, corpus_size(spec), this_machine()).cost
        display.print(f"[yellow]cost:[/yellow] {escape(cost.summary)}" if cost.over_a_day else
                      f"[dim]cost: {escape(cost.summary)}[/dim]")
    for warning in [*planned.warnings, *data_warnings(spec)]:
        display.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def resume(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    artifacts: StudyArtifacts = None,
    address: Address = None,
) -> None:
    """Continue a study from the database: trials left running by a stopped controller are marked
    failed (interrupted) and run again, until every family has its trials. Exit status as for launch."""
    settings = Settings.from_options(storage, artifacts, address)
    spec, document = stored_study(settings, name, missing_exit=2)
    _run_study(spec, document, in_study_store(settings, name, artifacts))


def _run_study(spec: "StudySpec", document: str, settings: Settings, vocab_size: int | None = None) -> None:
    """Runs the study and prints its summary; with `vocab_size` (a launch), the plan's warnings too."""
    from lm_tuner.tuner.cli.progress import live_progress
    from lm_tuner.tuner.run.controller import (
        StudyConflict,
        StudyRefused,
        launch_study,
        prepared_corpus,
        refuse_continuing_apart,
    )

    try:  # before the header, which names the store the study would write to and the data it would read
        refuse_continuing_apart(settings, spec.name, prepared_corpus(spec))
    except (StudyConflict, StudyRefused) as error:
        refuse(error)
    console.print(
        f"[bold]{spec.name}[/bold]: {', '.join(spec.families)} at {spec.parameter_budget:,} parameters, "
        f"{_trials_said(spec)}, sampler {spec.tuning.sampler}, "
        f"{spec.tuning.concurrency} at a time\n[dim]database {escape(masked_url(settings.storage_url))}\n"
        f"checkpoints {escape(masked_url(settings.artifact_root))}[/dim]"
    )
    from lm_tuner.tuner.run.budgeting import stored_budget_plan

    if spec.compute_budget is not None and stored_budget_plan(settings.storage_url, spec.name) is None:
        console.print("[dim]timing each family here for the compute budget's plan (about 10 s)[/dim]")
    try:
        with stopping_cleanly(), live_progress(settings.storage_url, spec) as printer:
            warn = None if vocab_size is None else partial(_print_warnings, spec, vocab_size, printer.display,
                                                           settings.storage_url)
            final = launch_study(spec, document, settings, callbacks=[printer], while_ray_starts=warn)
    except (StudyConflict, StudyRefused) as error:
        refuse(error)
    except KeyboardInterrupt:
        exit_stopped(f"`tuner resume {spec.name}` (or the same launch) continues the study")
    print_study(settings, spec.name)
    raise typer.Exit(0 if final == "complete" else 1)


def sensitivity(
    name: Annotated[str, typer.Argument(help="study name")],
    parameter: Annotated[str, typer.Option("--parameter", "-p", metavar="P",
                                           help="the hyperparameter to move (one the family searched)")],
    seeds: Annotated[int, typer.Option(min=1, help="training seeds per moved value (new seeds, as reruns use)")] = 3,
    points: Annotated[int, typer.Option(min=2, help="moved values across best ± 15% of the range")] = 5,
    family: Annotated[Optional[str], typer.Option(help="the family whose best to move [default: the best family]")]
    = None,
    storage: StorageOption = None,
    artifacts: StudyArtifacts = None,
    address: Address = None,
) -> None:
    """Measure how sensitive the result is to one hyperparameter: train the best configuration again with P
    moved to POINTS values evenly across ±15% of its searched range around the best value (on the log scale
    for log-scaled ranges, clipped to the range), SEEDS seeds each, and print mean ± std of the validation
    score per value. Runs already made are reused. The dashboard plots the result at
    /dashboard/studies/NAME/sensitivity. Exit status: 0 done, 1 no such study, 2 a refused request."""
    from lm_tuner.tuner.analysis.sensitivity import measured_effect
    from lm_tuner.tuner.analysis.sensitivity import sensitivity_runs as runs_of
    from lm_tuner.tuner.run.controller import connect_ray
    from lm_tuner.tuner.run.sensitivity import SensitivityError, plan_sensitivity, run_queued_sensitivity

    settings = Settings.from_options(storage, artifacts, address)
    spec, _ = stored_study(settings, name, missing_exit=1)
    settings = in_study_store(settings, name, artifacts)
    try:
        plan = plan_sensitivity(settings.storage_url, name, parameter, seeds=seeds, points=points, family=family)
    except SensitivityError as error:
        refuse(error)
    console.print(f"[bold]{name}[/bold]: {plan.family} trial {plan.best_trial_id} with {parameter} = "
                  f"{plan.best_value:.4g} moved to {', '.join(f'{v:.4g}' for v in plan.values)}; "
                  f"{len(plan.seeds)} seed(s) each, {plan.queued} new run(s)")
    try:
        with stopping_cleanly():
            connect_ray(settings)
            run_queued_sensitivity(spec, settings)
    except KeyboardInterrupt:
        exit_stopped("the same command continues the runs")
    effect = measured_effect(runs_of(settings.storage_url, name, parameter))
    table = PlainTable(parameter, "mean", "std", "runs",
                       title=f"{name} ({plan.family}): measured effect of {parameter}")
    for row in effect[effect["family"] == plan.family].itertuples():
        table.add_row(f"{row.value:.4g}", f"{row.mean:.3f}", f"{row.std:.3f}", str(row.count))
    console.print(table)


def worker(
    storage: StorageOption = None,
    artifacts: Artifacts = None,
    address: Annotated[Optional[str], typer.Option("--address", help="Ray cluster to run trials on")] = None,
    once: Annotated[bool, typer.Option("--once", help="exit when the queue is empty")] = False,
    poll_seconds: Annotated[float, typer.Option(help="how often to look for queued studies")] = 2.0,
    ray_idle_seconds: Annotated[float, typer.Option(
        min=0, help="how long the queue stays empty before the local Ray this worker started is shut down (its "
                    "processes hold a gigabyte or more; the next study starts it again)")] = RAY_IDLE_SECONDS,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar=DEBUG_VARIABLE, help="log the traceback of a study that fails as expected (its data "
                                               "cannot be read or downloaded, it is refused), besides its one line")
    ] = False,
) -> None:
    """Run studies submitted over REST (queued in the database), one at a time. Once the queue has been empty for
    --ray-idle-seconds, the local Ray it started is shut down (the next study starts it again).

    SIGINT or SIGTERM stops it cleanly: the study it runs goes back to the queue (its running trials marked
    interrupted, to run again), every child process ends; exit status 0."""
    from lm_tuner.tuner.cli.common import options
    from lm_tuner.tuner.run.queue import run_worker

    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    if debug or options["debug"]:  # `tuner --debug worker` too
        logging.getLogger("lm_tuner").setLevel(logging.DEBUG)
    settings = Settings.from_options(storage, artifacts, address)
    try:
        with stopping_cleanly():
            run_worker(settings, poll_seconds=poll_seconds, once=once, ray_idle_seconds=ray_idle_seconds)
    except KeyboardInterrupt:
        logging.getLogger(__name__).info("worker stopped")
