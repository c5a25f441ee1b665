"""What `tuner status` (and the end of `launch`) prints about a study: every family's trials by outcome and its
best, the trials of each family ranked, which validation set the scores are on, the corpus's unigram baseline,
and, while the study runs, that all of it is provisional."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from lm_tuner.tuner.analysis.family_tallies import FamilyTally, family_tallies, rerun_counts, tally
from lm_tuner.tuner.analysis.study_facts import (
    Baseline,
    baseline_warning,
    is_provisional,
    no_better_than_baseline,
    study_baseline,
    validation_label,
)
from lm_tuner.tuner.cli.common import PlainTable, console, duration_text, score_name, unclipped
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store import BaselineOut, Storage, StudyDetailOut, StudyView, TrialOut, TrialView

if TYPE_CHECKING:
    from lm_tuner.tuner.spec.priors import FamilyPrior

SHOWN_PER_FAMILY = 5  # ranked trials of each family shown without --all

FAILURES_SHOWN = 10


def print_study(settings: Settings, name: str, *, as_json: bool = False, every_trial: bool = False) -> bool:
    """Print the study `name`; False if there is none."""
    url = settings.storage_url
    study = Storage(url).study(name)
    if study is None:
        return False
    tallies = family_tallies(url, name)
    baseline = study_baseline(study)
    if as_json:
        payload = StudyDetailOut.of(study, BaselineOut(**asdict(baseline))).model_dump(mode="json")
        payload["trials"] = [TrialOut.of(t).model_dump(mode="json") for t in Storage(url).trials(name).items]
        payload |= {"provisional": is_provisional(study.status), "tuning_validation": validation_label(study.spec),
                    "families_tuning": {family: asdict(tally(tallies, family, "tune")) for family in study.families},
                    "priors": [prior.model_dump() for prior in _priors(study)]}
        print(json.dumps(payload, indent=2))
        return True
    unit = unit_of(study.spec)
    _print_heading(study, unit, baseline)
    best = Storage(url).best_trials(name)
    _print_families(study, tallies, best, unit)
    _print_priors(study)
    warning = baseline_warning(no_better_than_baseline(baseline, {family: _full_or_tuning_loss(best.get(family))
                                                                 for family in study.families}))
    if warning:
        console.print(f"warning: {warning}", style="yellow", markup=False)
    hidden = False
    for family in study.families:
        hidden |= _print_ranked(url, study, family, tally(tallies, family, "tune"), unit, every_trial)
    if hidden:
        console.print(f"[dim]the best {SHOWN_PER_FAMILY} complete trials of each family are shown; "
                      f"`tuner status {name} --all` lists every trial[/dim]")
    _print_failures(url, name)
    return True


def _print_heading(study: StudyView, unit: Unit, baseline: Baseline) -> None:
    known = (f", best possible perplexity {study.best_possible_perplexity:.3f}"
             if study.best_possible_perplexity else "")
    provisional = " — [yellow]provisional[/yellow]: the study is still running, every result can change" \
        if is_provisional(study.status) else ""
    console.print(f"\n[bold]{study.name}[/bold] ({study.status}) budget {study.parameter_budget:,} parameters{known}"
                  f"{provisional}")
    stages = ", ".join(f"{stage.label} {stage.settled}/{stage.planned}" for stage in study.progress.stages)
    eta = study.progress.eta_seconds
    console.print(f"trials: {stages}" + ("" if eta is None else f"; about {duration_text(eta)} left in "
                                                                  f"{study.progress.current.label}"))
    if baseline.loss is None:
        console.print(f"unigram baseline: unknown ({baseline.unknown_because})", markup=False)
    else:
        console.print(f"unigram baseline: {score_name(unit)} {unit.of(baseline.loss):.3f} (word frequencies alone)")
    if study.corpus_digest:
        console.print(f"tokens: sha256 {study.corpus_digest}", style="dim", markup=False)  # 79 columns: one line
    if study.error:
        console.print(study.error, style="red", markup=False)  # stored text: never read as markup
    for warning in study.warnings:
        console.print(f"warning: {warning}", style="yellow", markup=False)


def _print_families(study: StudyView, tallies, best: dict[str, TrialView | None], unit: Unit) -> None:
    label = validation_label(study.spec)
    provisional = " (provisional)" if is_provisional(study.status) else ""
    reruns = rerun_counts(study.spec, tallies)
    subset = label != "full"
    interrupted = sum(tally(tallies, family, "tune").interrupted for family in study.families)
    columns = ["family", "complete", "pruned", "failed", *(["interrupted"] if interrupted else []), "running",
               f"best {score_name(unit)} ({label})",
               *([f"its {score_name(unit)} (full)"] if subset else []), "best trial",
               *(["reruns finished"] if reruns else [])]
    table = PlainTable(*columns, title="tuning trials per family" + provisional)
    for family in study.families:
        counts, top = tally(tallies, family, "tune"), best.get(family)
        row = [family, *(str(n) for n in (counts.complete, counts.pruned, counts.failed,
                                            *([counts.interrupted] if interrupted else []), counts.running)),
               "-" if top is None else f"{unit.of(top.value):.3f}{provisional}",
               *([_full(top, unit)] if subset else []), "-" if top is None else f"#{top.number}"]
        if reruns:
            row.append(f"{reruns[family].finished}/{reruns[family].planned}")
        table.add_row(*row)
    console.print(unclipped(table))
    if interrupted:
        console.print("interrupted: stopped with their controller or by a cancel; counted in no outcome, they run "
                      "again when the study continues", style="dim", markup=False)
    if subset:
        console.print(f"tuning scores are on the first {label.removeprefix('subset of ')} of the validation set; "
                      f"(full): the whole set, scored after tuning for the best trials only", style="dim",
                      markup=False)


def _priors(study: StudyView) -> list[FamilyPrior]:
    """The published configurations the study's families start from; a study without them (or stored before they
    existed) does not load the model families."""
    if not study.spec.get("tuning", {}).get("priors"):
        return []
    from lm_tuner.tuner.spec.priors import stored_study_priors

    return stored_study_priors(study.spec)


def _print_priors(study: StudyView) -> None:
    """A line per family: the published configuration its first trials include, scaled as shown."""
    priors = _priors(study)
    if not priors:
        return
    from lm_tuner.tuner.spec.priors import prior_line

    for prior in priors:
        console.print(f"starts from (tuning.priors) {prior_line(prior)}", style="dim", markup=False, soft_wrap=True)


def _print_ranked(url: str, study: StudyView, family: str, counts: FamilyTally, unit: Unit, every_trial: bool) -> bool:
    """The family's tuning trials, best first: the best few complete ones, or every trial. True if some were
    left out."""
    state = None if every_trial else "COMPLETE"
    page = Storage(url).trials(study.name, family=family, stage="tune", state=state, sort="value",
                        limit=None if every_trial else SHOWN_PER_FAMILY)
    if not page.items:
        console.print(f"[bold]{family}[/bold]: no {'' if every_trial else 'complete '}trial yet")
        return False
    shown = f"all {page.total} trials" if every_trial else \
        f"best {len(page.items)} of {counts.complete} complete trials"
    label = validation_label(study.spec)
    subset = label != "full"
    memory = any(trial.reversed_accuracy is not None for trial in page.items)  # a reverse-copy task
    table = PlainTable("rank", "trial", *(["state"] if every_trial else []), f"{score_name(unit)} ({label})",
                       *([f"{score_name(unit)} (full)"] if subset else []),
                       *(["reversed half: loss", "accuracy"] if memory else []), "parameters", "hidden",
                       "hyperparameters", title=f"{family}: {shown}", title_justify="left")
    for rank, trial in enumerate(page.items, 1):
        params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        value = "-" if trial.value is None else f"{unit.of(trial.value):.3f}"
        table.add_row(str(rank) if trial.value is not None else "-", f"#{trial.number}",
                      *([_state(trial)] if every_trial else []), value, *([_full(trial, unit)] if subset else []),
                      *(_reversed_half(trial) if memory else ()),
                      "-" if trial.parameter_count is None else f"{trial.parameter_count:,}",
                      "-" if trial.hidden_size is None else str(trial.hidden_size),
                      params)
    console.print(unclipped(table))
    return not every_trial and counts.complete > len(page.items)


def _print_failures(url: str, name: str) -> None:
    failed = Storage(url).trials(name, state="FAIL", limit=FAILURES_SHOWN)
    for trial in failed.items:
        reason = trial.fail_reason or "no reason was recorded (see the controller's log)"
        console.print(f"{trial.family}#{trial.number} {_state(trial, 'failed')}: {reason}", style="red",
                      markup=False)
    if failed.total > len(failed.items):
        console.print(f"[red]... and {failed.total - len(failed.items)} more failed trials[/red]")


def _state(trial: TrialView, failed: str = "fail") -> str:
    """A trial's state as the family table counts it: a failed trial that runs again on resume is interrupted."""
    return "interrupted" if trial.interrupted else failed if trial.state == "FAIL" else trial.state.lower()


def _reversed_half(trial: TrialView) -> tuple[str, str]:
    """Its best turn's loss (nats/token) and accuracy on the reversed halves of the reverse-copy examples."""
    if trial.reversed_loss is None or trial.reversed_accuracy is None:
        return "-", "-"
    return f"{trial.reversed_loss:.3f}", f"{trial.reversed_accuracy:.1%}"


def _full(trial: TrialView | None, unit: Unit) -> str:
    """A trial tuned on a validation subset, on the whole split: scored after tuning for the best ones only."""
    if trial is None:
        return "-"
    return "-" if trial.full_value is None else f"{unit.of(trial.full_value):.3f}"


def _full_or_tuning_loss(trial: TrialView | None) -> float | None:
    """A best trial's loss on the whole validation split where it was rescored, else its tuning score."""
    if trial is None:
        return None
    return trial.full_value if trial.full_value is not None else trial.value
