"""Commands that read studies: `status`, `list`, `best`, `compare` and `export`."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from lm_tuner.tuner.settings import Settings

if TYPE_CHECKING:
    pass

from lm_tuner.tuner.cli.common import (
    JsonOutput,
    Storage,
    console,
    no_such_study,
    refuse,
    settings_for_reading,
)


def status(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """Show a study: trials by state per family, the best trials, the best possible perplexity if known."""
    settings = settings_for_reading(storage)
    if not print_study(settings, name, as_json=json_output):
        no_such_study(settings, name, 1)


def list_command(storage: Storage = None, json_output: JsonOutput = False) -> None:
    """List studies, newest first."""
    from lm_tuner.tuner.store.documents import StudyOut
    from lm_tuner.tuner.store.studies import list_studies

    settings = settings_for_reading(storage)
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


def best(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """The best complete trial of each family: value, hyperparameters, size and checkpoint."""
    from lm_tuner.tuner.store.documents import TrialOut
    from lm_tuner.tuner.store.studies import best_trials

    settings = settings_for_reading(storage)
    found = best_trials(settings.storage_url, name)
    if found is None:
        no_such_study(settings, name, 1)
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


def compare(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: Storage = None,
    json_output: JsonOutput = False,
) -> None:
    """The families side by side (Table 2.1 of the paper): best tuning run, then validation and test with
    and without MC dropout and dynamic evaluation, mean ± std over the reruns, and the winner."""
    from dataclasses import asdict

    from lm_tuner.tuner.analysis.comparison import comparison

    settings = settings_for_reading(storage)
    found = comparison(settings.storage_url, name)
    if found is None:
        no_such_study(settings, name, 1)
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
        refuse(f"--format: got {output_format!r}; allowed: csv, json")
    settings = settings_for_reading(storage)
    if get_study(settings.storage_url, name) is None:
        no_such_study(settings, name, 1)
    table = trials_table(study_trials(settings.storage_url, name).items)
    text = table.to_csv(index=False) if output_format == "csv" else table.to_json(orient="records", indent=2,
                                                                                 date_format="iso")
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        console.print(f"wrote {len(table)} trials to {output}")


def print_study(settings: Settings, name: str, *, as_json: bool = False) -> bool:
    from lm_tuner.tuner.store.documents import StudyDetailOut, TrialOut
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
