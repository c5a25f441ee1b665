"""Commands that read studies: `status`, `list`, `best`, `compare` and `export`."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from lm_tuner.trainers import artifact_store
from lm_tuner.tuner.cli.common import (
    JsonOutput,
    PlainTable,
    StorageOption,
    StudyArtifacts,
    console,
    fail,
    no_such_study,
    output_file,
    output_folder,
    refuse,
    score_name,
    settings_for_reading,
)
from lm_tuner.tuner.cli.status_report import print_study
from lm_tuner.tuner.settings import ArtifactRoot, masked_url
from lm_tuner.tuner.store import Storage, TrialView, study_artifacts

if TYPE_CHECKING:
    from lm_tuner.tuner.spec.units import Unit

__all__ = ["best", "compare", "export", "list_command", "print_study", "status"]


def status(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    json_output: JsonOutput = False,
    every_trial: Annotated[bool, typer.Option("--all", help="list every trial of each family, not only the best 5")]
    = False,
) -> None:
    """Show a study: every family's tuning trials by outcome and its best, each family's trials ranked, which
    validation set the scores are on, the unigram baseline of the corpus and the best possible perplexity if
    known. While the study runs, its results are marked provisional."""
    settings = settings_for_reading(storage)
    if not print_study(settings, name, as_json=json_output, every_trial=every_trial):
        no_such_study(settings, name, 1)


def list_command(storage: StorageOption = None, json_output: JsonOutput = False) -> None:
    """List studies, newest first."""
    from lm_tuner.tuner.store import StudyOut

    settings = settings_for_reading(storage)
    studies = Storage(settings.storage_url).studies().items
    if json_output:
        print(json.dumps([StudyOut.of(s).model_dump(mode="json") for s in studies], indent=2))
        return
    table = PlainTable("study", "status", "families", "budget", "finished", "best val ppl")
    for study in studies:
        best = f"{study.best.perplexity:.3f} ({study.best.family})" if study.best else "-"
        table.add_row(study.name, study.status, ", ".join(study.families), f"{study.parameter_budget:,}",
                      f"{study.trials_finished}/{study.trials_expected}", best)
    console.print(table)


def best(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    artifacts: StudyArtifacts = None,
    download: Annotated[Optional[Path], typer.Option(
        "--download", metavar="DIR", help="copy each family's best checkpoint into DIR, from the artifact store "
                                          "(a folder or object storage), checked against its recorded SHA-256")]
    = None,
    json_output: JsonOutput = False,
) -> None:
    """The best complete trial of each family: value (on the validation set tuning scored, and on the whole set
    where it was rescored after tuning), hyperparameters, size and checkpoint (in the artifact store the study ran
    with, unless --artifacts names another)."""
    from lm_tuner.tuner.analysis.study_facts import validation_label
    from lm_tuner.tuner.spec.units import unit_of

    settings = settings_for_reading(storage)
    found = Storage(settings.storage_url).best_trials(name)
    if found is None:
        no_such_study(settings, name, 1)
    spec = Storage(settings.storage_url).study(name).spec
    label, unit = validation_label(spec), unit_of(spec)
    root = study_artifacts(settings, name, artifacts)
    if download:
        output_folder(download, "--download")
    copies = {family: _download(root / trial.checkpoint.path, trial, download)
              for family, trial in found.items() if download and trial and trial.checkpoint}
    if json_output:
        print(json.dumps({family: _best_document(trial, label, root) if trial else None
                          for family, trial in found.items()}, indent=2))
        return
    for family, trial in found.items():
        if trial is None:
            console.print(f"[bold]{family}[/bold]: no complete trial yet")
            continue
        checkpoint = root / trial.checkpoint.path if trial.checkpoint else "none"
        shown = masked_url(checkpoint)
        if trial.checkpoint and not artifact_store.exists(checkpoint):
            shown = f"{shown} (missing: give the artifact store with --artifacts)"
        console.print(f"[bold]{family}[/bold] #{trial.number}: {score_name(unit)} ({label}) "
                      f"{unit.of(trial.value):.3f} (cross-entropy {trial.value:.4f} nats){_full_score(trial, unit)}, "
                      f"{trial.parameter_count:,} parameters, hidden {trial.hidden_size}, seed {trial.seed}")
        for key, value in trial.params.items():
            console.print(f"    {key} = {value}")
        console.print(f"    checkpoint {shown}", markup=False)
        if family in copies:
            console.print(f"    downloaded to {copies[family]}")


def _full_score(trial: TrialView, unit: "Unit") -> str:
    """Where tuning scored a validation subset: the checkpoint's score on the whole set, or why there is none."""
    if not trial.val_subset:
        return ""
    if trial.full_value is None:
        return "; full set: not scored yet (the best trials are rescored once tuning is over)"
    return f"; full set {unit.of(trial.full_value):.3f}"


def _best_document(trial: TrialView, label: str, root: ArtifactRoot) -> dict[str, Any]:
    """A best trial as `--json` gives it: the REST API's trial, which validation set `value` is on, and the
    checkpoint's location in the artifact store (a file path, or an object-storage URL) beside its REST URL."""
    from lm_tuner.tuner.store import TrialOut

    document = TrialOut.of(trial).model_dump(mode="json") | {"validation": label}
    if trial.checkpoint is not None:
        document["checkpoint"]["path"] = masked_url(root / trial.checkpoint.path)
    return document


def _download(checkpoint: artifact_store.Location, trial: TrialView, folder: Path) -> Path:
    """Copy a trial's checkpoint into `folder` (named as the API names it), refusing bytes whose SHA-256 is not
    the one recorded when it was written."""
    if not artifact_store.exists(checkpoint):
        fail(f"--download: no checkpoint at {masked_url(checkpoint)}; give the artifact store with --artifacts", 1)
    copy = folder / f"{trial.study}-{trial.family}-{trial.number}.pt".replace("/", "-")
    with copy.open("wb") as handle:
        for chunk in artifact_store.chunks(checkpoint):
            handle.write(chunk)
    if artifact_store.sha256(copy) != trial.checkpoint.sha256:
        copy.unlink()
        fail(f"--download: {checkpoint} does not match the SHA-256 recorded for trial {trial.trial_id} "
             f"(the file was replaced after the trial wrote it)", 1)
    return copy


def compare(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    json_output: JsonOutput = False,
) -> None:
    """The families side by side (Table 2.1 of the paper): best tuning run, then validation and test with
    and without MC dropout and dynamic evaluation, mean ± sd over the reruns; each family's tuning at equal
    training tokens and at equal compute (CPU core-seconds or GPU-seconds) with its tokens per second, and who
    wins at each; and the winner, with the budget it holds under: named only once every planned rerun of every
    family has finished, never for a study of one family, and only where the seeds separate it from the
    runner-up (the 95% interval of the difference, Welch's t over the seeds, excludes 0; else "no clear winner at
    this budget" and what more trials would buy by the tuning curves)."""
    from lm_tuner.tuner.analysis.comparison import comparison, comparison_document
    from lm_tuner.tuner.analysis.study_facts import study_baseline
    from lm_tuner.tuner.cli.compare_report import print_comparison

    settings = settings_for_reading(storage)
    found = comparison(settings.storage_url, name)
    if found is None:
        no_such_study(settings, name, 1)
    baseline = study_baseline(Storage(settings.storage_url).study(name))
    if json_output:
        print(json.dumps(comparison_document(found, baseline), indent=2))
        return
    print_comparison(found, baseline)


def export(
    name: Annotated[str, typer.Argument(help="study name")],
    storage: StorageOption = None,
    output_format: Annotated[str, typer.Option("--format", help="csv or json")] = "csv",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write [default: stdout]")] = None,
) -> None:
    """Every metric of every trial of a study, one row each: family, stage, state, value (and which validation set
    it is on), size, hyperparameters (`param.*`), the final evaluations (`eval.KIND.*`: test protocol, MC dropout,
    dynamic evaluation) and the last learning-curve values (last.*)."""
    from lm_tuner.tuner.analysis.trial_frames import export_frame

    if output_format not in ("csv", "json"):
        refuse(f"--format: got {output_format!r}; allowed: csv, json")
    if output is not None:
        output_file(output, "--output")
    settings = settings_for_reading(storage)
    if Storage(settings.storage_url).study(name) is None:
        no_such_study(settings, name, 1)
    table = export_frame(settings.storage_url, name)
    text = table.to_csv(index=False) if output_format == "csv" else table.to_json(orient="records", indent=2,
                                                                                 date_format="iso")
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        console.print(f"wrote {len(table)} trials to {output}", markup=False)
