"""`tuner plan`: what a study would train and how long it would take on this machine, before anything exists."""

from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.text import Text

from lm_tuner.tuner.cli.common import JsonOutput, PlainTable, console, errors, refuse, refuse_spec

if TYPE_CHECKING:
    from lm_tuner.tuner.spec.estimate import ProbeTiming
    from lm_tuner.tuner.spec.plan import FamilyPlan, StudyCost, StudyPlan


def plan(
    space: Annotated[str, typer.Option(
        "--space", metavar="FILE|NAME",
        help="the study spec (YAML or JSON): a file, else a shipped space by name (`tuner spaces` lists them)")],
    probe: Annotated[bool, typer.Option(
        "--probe/--no-probe", help="time a few training steps and evaluations of each family's median shape here "
                                   "(about --seconds, with the study's threads per trial) to estimate the study's "
                                   "duration; without it (or for a GPU study on a machine without one) the cost "
                                   "comes from a FLOP count")] = True,
    seconds: Annotated[float, typer.Option(min=1.0, help="how long the probe runs, all families together")] = 10.0,
    json_output: JsonOutput = False,
) -> None:
    """Show what a study would train, before launching it: per family the hidden sizes the budget gives across
    the searched ranges (smallest, median, largest over the ranges' corners and a fixed random sample), where the
    parameters of the median shape go (embedding, recurrent layers, softmax), the trials, and, from the probe,
    the time per trial on this machine. Then the cost of the whole study (tuning, reruns, test protocol, dynamic
    evaluation) in GPU-hours or core-hours and its duration here, from the probe or else from a FLOP count at the
    speed benchmarks measured on a machine of this kind; the line says which, and whether it is over a day. Then
    the warnings: a small recurrent share or hidden size, a reverse-copy window too short for its examples,
    evaluation taking more than a quarter of a trial, data mostly out of its vocabulary, and what `launch` would
    refuse.

    Creates nothing: no database, no Ray, no checkpoint. PTB and generated corpora are planned without their data;
    another dataset whose vocabulary the spec does not fix is read (a registered one is fetched into the data cache
    first, as a launch would). Exit status: 0 planned (with or without warnings), 2 the spec or its dataset cannot
    be read.
    """
    from lm_tuner.tuner.run.probe import study_plan
    from lm_tuner.tuner.run.study_data import DatasetUnavailable
    from lm_tuner.tuner.spec import SpecError
    from lm_tuner.tuner.spec.shipped import UnknownSpace, resolve_space

    try:
        spec, _ = resolve_space(space).read()
    except UnknownSpace as error:  # before SpecError's ValueError
        refuse(f"--space: {error}")
    except SpecError as error:
        refuse_spec(error)
    try:
        planned = study_plan(spec, probe=probe, seconds=seconds, probing=partial(_say_probing, seconds),
                             probed=_say_probed)
    except DatasetUnavailable as error:
        refuse(error)
    if json_output:
        print(planned.model_dump_json(indent=2))
        return
    print_plan(planned)


def _say_probing(seconds: float) -> None:
    errors.print(f"probing each family's median shape on this machine for about {seconds:g} s, longer where "
                 f"one training step and one evaluation take longer (--no-probe skips it)", style="dim")


def _say_probed(family: str, timing: "ProbeTiming", seconds: float) -> None:
    errors.print(f"  {family}: probed in {seconds:.1f} s (a training step {timing.step_seconds * 1000:,.1f} ms)",
                 style="dim", markup=False)


def print_plan(planned: "StudyPlan") -> None:
    console.print(f"[bold]{planned.study}[/bold]: {len(planned.families)} famil"
                  f"{'y' if len(planned.families) == 1 else 'ies'} at {planned.parameter_budget:,} parameters, "
                  f"vocabulary {planned.vocab_size:,}")
    for family in planned.families:
        console.print(_family_table(family, budgeted=planned.budget is not None))
    if planned.estimate is not None:
        estimate = planned.estimate
        runs = "its compute budget" if planned.budget is not None else f"{sum(f.runs for f in planned.families)} runs"
        console.print(f"study: {runs}, about "
                      f"[bold]{duration(estimate.study_seconds)}[/bold] with {estimate.parallel_trials} at a time "
                      f"on this machine ({estimate.device}, {estimate.threads} thread(s) per trial; probe "
                      f"{estimate.probe_seconds:.1f} s; not included: {', '.join(estimate.not_included)})")
    if planned.budget is not None:
        from lm_tuner.tuner.cli.budget_report import print_budget

        print_budget(planned.budget)
    if planned.cost is not None:
        print_cost(planned.cost)
    for note in planned.notes:
        console.print(f"note: {note}", markup=False)
    for warning in planned.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def print_cost(cost: "StudyCost") -> None:
    """The cost in one line (in yellow for a study of more than a day), then where its speed is from."""
    style = "yellow" if cost.over_a_day else None
    console.print(f"cost: {cost.summary}", style=style, markup=False)
    for note in cost.notes:
        console.print(f"  {note}", style="dim", markup=False)


def _family_table(family: "FamilyPlan", budgeted: bool) -> PlainTable:
    table = PlainTable("", "value", title=f"family {family.family}", title_justify="left", show_header=False)
    table.add_row("configurations tried" if budgeted else "trials",
                  f"{family.trials} (+{family.runs - family.trials} reruns)")
    table.add_row("sampled configurations", f"{family.sampled_points} ({family.infeasible_points} over the budget)")
    if family.hidden_size is not None:
        hidden = family.hidden_size
        table.add_row("hidden size min / median / max", f"{hidden.min:,} / {hidden.median:,} / {hidden.max:,}")
        table.add_row("embedding size (median shape)", f"{family.embedding_size:,}")
        total = family.parameters["total"]
        for part in ("embedding", "recurrent", "softmax"):
            count = family.parameters[part]
            table.add_row(f"{part} parameters", f"{count:,} ({count / total:.0%})")
        table.add_row("total parameters", f"{total:,}")
    if family.prior is not None:
        from lm_tuner.tuner.spec.priors import prior_line

        line = prior_line(family.prior).removeprefix(f"{family.family}: ")
        table.add_row("starts from (tuning.priors)", Text(line, overflow="fold"))  # the source path whole
    if family.estimate is not None:
        estimate = family.estimate
        table.add_row("training step", f"{estimate.step_seconds * 1000:,.1f} ms")
        table.add_row("evaluation per turn", f"{estimate.evaluation_seconds:,.2f} s")
        table.add_row("turns per trial" + (" (a finalist's)" if budgeted else ""), f"{estimate.turns:,}")
        table.add_row("time per trial" + (" (a finalist's)" if budgeted else ""),
                      f"{duration(estimate.trial_seconds)} ({estimate.evaluation_share:.0%} evaluating)")
    return table


def duration(seconds: float) -> str:
    from lm_tuner.tuner.spec.cost import duration as readable

    return readable(seconds)
