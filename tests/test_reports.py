"""Reports you can act on: `tuner status` shows every family and marks a running study's results provisional,
`tuner compare` names a winner only from finished reruns, `tuner export` writes every metric of every trial.
Trial rows are written directly (no Ray, no training), as tests/test_progress.py does."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import httpx
import pandas
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from lm_tuner.tuner.analysis.comparison import Estimate, comparison, margin
from lm_tuner.tuner.analysis.study_facts import validation_label
from lm_tuner.tuner.analysis.trial_frames import export_frame
from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord, TurnRecord
from lm_tuner.tuner.store.studies import get_study
from tests.conftest import TINY_SPEC, serve_app
from tests.test_progress import add_study, add_trial

SUBSET = {**TINY_SPEC["training"], "validation_tokens": 2000}

TWO_FAMILIES = {"families": ["lstm", "mogrifier"],
                "fixed": {"num_layers": 1, "mogrifier_rounds": 2, "mogrifier_rank": 2}}


def trial(url: str, study: str, family: str, state: str, value: float | None = None, stage: str = "tune") -> int:
    trial_id = add_trial(url, study, stage, state, family=family)
    with sessions(url).begin() as session:
        session.get(TrialRecord, trial_id).value = value
    return trial_id


def rescore(url: str, trial_id: int, full_value: float) -> None:
    """A trial tuned on a validation subset, scored on the whole split after tuning."""
    with sessions(url).begin() as session:
        session.get(TrialRecord, trial_id).full_value = full_value


def set_status(url: str, study: str, status: str) -> None:
    with sessions(url).begin() as session:
        session.scalar(select(StudyRecord).where(StudyRecord.name == study)).status = status


def command(url: str, *arguments: str) -> str:
    result = CliRunner().invoke(app, [*arguments, "--storage", url], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def row(text: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with `first_cell`."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{text}")


def test_the_validation_label_comes_from_the_stored_spec():
    assert validation_label({"training": {"validation_tokens": 2000}}) == "subset of 2,000 tokens"
    assert validation_label({"training": {"validation_tokens": None}}) == "full"
    assert validation_label({"training": {}}) == validation_label({}) == "full"  # stored before the field existed


def test_status_of_a_running_study_shows_every_family_ranked_and_provisional(storage_url):
    add_study(storage_url, "live", **TWO_FAMILIES, tuning={"trials": 8, "concurrency": 2}, training=SUBSET)
    ids = [trial(storage_url, "live", "lstm", "COMPLETE", value) for value in (4.0, 3.0, 5.0, 2.5, 3.5, 4.5, 6.0)]
    trial(storage_url, "live", "lstm", "PRUNED")
    trial(storage_url, "live", "mogrifier", "RUNNING")
    rescore(storage_url, ids[3], 2.6)

    text = command(storage_url, "status", "live")
    assert "live (running)" in text and "provisional" in text.splitlines()[1]
    assert "best val ppl (subset of 2,000 tokens)" in text and "unigram baseline:" in text
    assert row(text, "lstm")[1:8] == ["7", "1", "0", "0", f"{math.exp(2.5):.3f} (provisional)", f"{math.exp(2.6):.3f}",
                                      "#3"]
    assert row(text, "mogrifier")[1:8] == ["0", "0", "0", "1", "-", "-", "-"]
    assert "lstm: best 5 of 7 complete trials" in text and "mogrifier: no complete trial yet" in text
    assert row(text, "1")[1:4] == ["#3", f"{math.exp(2.5):.3f}", f"{math.exp(2.6):.3f}"]  # subset, then full
    assert row(text, "2")[1:4] == ["#1", f"{math.exp(3.0):.3f}", "-"]  # not rescored
    assert [row(text, str(rank))[1] for rank in range(3, 6)] == ["#4", "#0", "#5"]
    assert "`tuner status live --all` lists every trial" in text

    every = command(storage_url, "status", "live", "--all")
    assert "lstm: all 8 trials" in every and "mogrifier: all 1 trials" in every
    assert row(every, "7")[1:4] == ["#6", "complete", f"{math.exp(6.0):.3f}"]
    assert "--all` lists" not in every

    payload = json.loads(command(storage_url, "status", "live", "--json"))
    assert payload["provisional"] is True and payload["tuning_validation"] == "subset of 2,000 tokens"
    assert payload["families_tuning"]["lstm"]["pruned"] == 1 and "unknown_because" in payload["unigram_baseline"]


def test_status_of_a_finished_study_is_not_provisional(storage_url):
    add_study(storage_url, "done", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2})
    trial(storage_url, "done", "lstm", "COMPLETE", 2.0)
    trial(storage_url, "done", "mogrifier", "FAIL")
    text = command(storage_url, "status", "done")
    assert "done (complete)" in text and "provisional" not in text and "val ppl (full)" in text
    assert row(text, "lstm")[5] == f"{math.exp(2.0):.3f}" and row(text, "mogrifier")[3] == "1"


def test_status_counts_interrupted_trials_in_the_family_table_as_its_list_does(storage_url):
    add_study(storage_url, "stopped", status="failed", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    trial(storage_url, "stopped", "lstm", "COMPLETE", 3.0)
    add_trial(storage_url, "stopped", "tune", "FAIL", family="lstm", interrupted=True)  # a Ctrl-C
    trial(storage_url, "stopped", "mogrifier", "FAIL")
    add_trial(storage_url, "stopped", "tune", "FAIL", family="mogrifier", interrupted=True)

    text = command(storage_url, "status", "stopped")
    header = next(line for line in text.splitlines() if "┃ family" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][:6] == [
        "family", "complete", "pruned", "failed", "interrupted", "running"]
    assert row(text, "lstm")[1:6] == ["1", "0", "0", "1", "0"]
    assert row(text, "mogrifier")[1:6] == ["0", "0", "1", "1", "0"]
    assert "interrupted: stopped with their controller or by a cancel; counted in no outcome" in text
    assert "lstm#1 interrupted: " in text and "mogrifier#0 failed: " in text and "mogrifier#1 interrupted: " in text

    every = command(storage_url, "status", "stopped", "--all")
    states = [row(every, rank)[2] for rank in ("1", "-")]  # lstm: its complete trial, then the interrupted one
    assert states == ["complete", "interrupted"]
    assert every.count("│ interrupted │") == 2 and every.count("│ fail ") == 1  # as the table counts them
    payload = json.loads(command(storage_url, "status", "stopped", "--json"))
    assert payload["families_tuning"]["lstm"] | {"best_value": None} == {
        "complete": 1, "pruned": 0, "failed": 0, "running": 0, "interrupted": 1, "best_value": None}


def test_status_without_interrupted_trials_has_no_such_column(storage_url):
    add_study(storage_url, "clean", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2})
    trial(storage_url, "clean", "lstm", "COMPLETE", 3.0)
    trial(storage_url, "clean", "mogrifier", "FAIL")
    text = command(storage_url, "status", "clean")
    assert "interrupted" not in text and "mogrifier#0 failed: " in text


def test_a_narrow_status_table_never_splits_a_hyperparameter(sqlite_url):
    """Piped to a file, the table is 80 columns wide: each name=value stays whole on a line of its own."""
    add_study(sqlite_url, "narrow", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    params = {"learning_rate": 0.006418, "input_dropout": 0.02589, "output_dropout": 0.1266}
    add_trial(sqlite_url, "narrow", "tune", "COMPLETE", family="lstm", params=params)
    text = CliRunner().invoke(app, ["status", "narrow", "--storage", sqlite_url], env={"COLUMNS": "80"}).output
    cells = [line.strip("│ ").split("│")[-1].strip() for line in text.splitlines() if line.startswith("│")]
    assert {"learning_rate=0.006418", "input_dropout=0.02589", "output_dropout=0.1266"} <= set(cells), text


def test_status_shows_a_value_with_brackets_as_written(sqlite_url):
    """A category such as `[bold]adam` is a value, not console markup."""
    add_study(sqlite_url, "marked", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    add_trial(sqlite_url, "marked", "tune", "COMPLETE", family="lstm", params={"optimizer": "[bold]adam"})
    text = CliRunner().invoke(app, ["status", "marked", "--storage", sqlite_url], env={"COLUMNS": "200"}).output
    assert "optimizer=[bold]adam" in text, text


def test_the_unigram_baseline_is_the_corpus_s(storage_url):
    corpus_stats = pytest.importorskip("lm_tuner.trainers.corpus_stats")
    from lm_tuner.trainers import dataset_from_dict, load_corpus

    add_study(storage_url, "base", status="complete")
    expected = corpus_stats.unigram_perplexity(load_corpus(dataset_from_dict(get_study(storage_url, "base")
                                                                             .spec["dataset"])))
    assert f"unigram baseline: val ppl {expected:.3f}" in command(storage_url, "status", "base")


def test_compare_waits_for_every_rerun_and_names_no_winner_the_seeds_do_not_separate(storage_url, tmp_path):
    add_study(storage_url, "seeded", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2},
              reruns={"top": 1, "seeds": 2})
    trial(storage_url, "seeded", "lstm", "COMPLETE", 2.0)
    trial(storage_url, "seeded", "mogrifier", "COMPLETE", 2.2)
    for value in (1.0, 1.2):
        trial(storage_url, "seeded", "lstm", "COMPLETE", value, stage="rerun")
    trial(storage_url, "seeded", "mogrifier", "COMPLETE", 0.9, stage="rerun")
    running = trial(storage_url, "seeded", "mogrifier", "RUNNING", stage="rerun")

    found = comparison(storage_url, "seeded")
    assert found.winner is None and found.verdict == "no winner yet: 3 of 4 reruns finished" and found.provisional
    rerun_stage = next(s for s in get_study(storage_url, "seeded").progress.stages if s.stage == "rerun")
    assert (found.reruns_finished, found.reruns_planned) == (rerun_stage.settled, rerun_stage.planned) == (3, 4)
    assert [(r.reruns_finished, r.reruns_planned, r.valid.count) for r in found.families] == [(2, 2, 2), (1, 2, 1)]
    text = command(storage_url, "compare", "seeded")
    assert "no winner yet: 3 of 4 reruns finished" in text and "provisional" in text and "winner:" not in text
    with serve_app(Settings(storage_url, tmp_path / "artifacts")) as base:  # REST says the same
        served = httpx.get(f"{base}/studies/seeded/comparison").json()
    assert served["verdict"] == found.verdict and served["provisional"] and served["winner"] is None
    assert [family["reruns_finished"] for family in served["families"]] == [2, 1]

    with sessions(storage_url).begin() as session:
        record = session.get(TrialRecord, running)
        record.state, record.value = "COMPLETE", 1.0
    set_status(storage_url, "seeded", "complete")
    found = comparison(storage_url, "seeded")
    # two seeds each: the 95% interval of the difference holds 0, so no winner is named
    assert found.winner is None and not found.provisional and "reruns" in found.winner_by
    assert found.verdict.startswith("no clear winner at this budget: mogrifier is ahead of lstm by")
    mogrifier = found.families[1]
    assert mogrifier.valid.mean == pytest.approx(math.exp(0.95), rel=0.01) and mogrifier.valid.count == 2
    text = command(storage_url, "compare", "seeded")
    assert "winner:" not in text and "(n=2)" in row(text, "mogrifier")[3] and "±" in row(text, "mogrifier")[3]
    assert "no clear winner at this budget: mogrifier is ahead of lstm" in " ".join(text.split())
    assert row(text, "lstm")[2] == "2/2"  # reruns finished
    payload = json.loads(command(storage_url, "compare", "seeded", "--json"))
    assert {"study", "unit", "families", "winner", "winner_by", "verdict", "reruns_planned"} <= set(payload)
    assert payload["winner"] is None and payload["families"][1]["valid"]["count"] == 2
    # two seeds each: the interval of the difference is wide, and the verdict says the seeds do not separate them
    assert found.margin.runner_up == "lstm" and found.margin.low < 0 < found.margin.difference < found.margin.high
    assert "the seeds do not separate them; by the tuning curves" in found.verdict
    assert "(Welch's t over the seeds): the seeds do not separate them" in " ".join(text.split())
    assert payload["margin"]["runner_up"] == "lstm" and payload["margin"]["low"] == pytest.approx(found.margin.low)


@pytest.mark.parametrize(("winner", "runner_up", "separated"), [
    ([1.00, 1.10, 1.05], [2.00, 2.10, 2.02, 2.06], True),
    ([1.00, 1.60], [1.20, 1.30, 1.10], False),
])
def test_the_winners_margin_is_welchs_interval_of_the_difference(winner, runner_up, separated):
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = scipy_stats.ttest_ind(runner_up, winner, equal_var=False).confidence_interval(0.95)
    found = margin(estimate(winner), estimate(runner_up), "lstm")
    assert (found.low, found.high) == pytest.approx((expected.low, expected.high))
    assert found.difference == pytest.approx(statistics.fmean(runner_up) - statistics.fmean(winner))
    assert found.separated is separated and found.runner_up == "lstm"


def test_no_interval_is_drawn_from_a_single_seed_or_without_spread():
    single = margin(estimate([1.0]), estimate([2.0, 2.1]), "lstm")
    assert (single.low, single.high, single.seeds) == (None, None, (1, 2)) and not single.separated
    assert single.difference == pytest.approx(1.05)
    assert "(1 and 2 seeds): no interval of the difference can be drawn" in single.sentence("perplexity")
    still = margin(estimate([1.0, 1.0]), estimate([2.0, 2.0]), "lstm")
    assert (still.low, still.high) == (None, None) and not still.separated


def estimate(values: list[float]) -> Estimate:
    return Estimate(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


def test_compare_waits_for_the_test_protocol_and_then_judges_on_it(storage_url):
    add_study(storage_url, "judged", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2},
              reruns={"top": 1, "seeds": 1}, evaluation={"bptt": 10})
    finals = {}
    for family, tuned, rerun in (("lstm", 2.0, 1.0), ("mogrifier", 2.1, 1.1)):
        trial(storage_url, "judged", family, "COMPLETE", tuned)
        finals[family] = trial(storage_url, "judged", family, "COMPLETE", rerun, stage="rerun")
    found = comparison(storage_url, "judged")
    assert found.winner is None and found.verdict == "no winner: the test protocol has scored 0 of 2 final models"
    assert "†" in command(storage_url, "compare", "judged")  # training-time scores are marked as such
    with sessions(storage_url).begin() as session:  # on full validation, mogrifier is better
        for family, loss in (("lstm", 1.5), ("mogrifier", 1.4)):
            session.add(EvaluationRecord(trial_id=finals[family], kind="deterministic", valid_loss=loss,
                                         test_loss=loss + 0.1, logit_scale=1.0, settings={}))
    found = comparison(storage_url, "judged")
    assert found.winner == "mogrifier" and "test protocol" in found.winner_by
    assert [r.valid_from for r in found.families] == ["test protocol", "test protocol"]


def test_a_study_tuned_on_a_validation_subset_is_judged_on_the_full_set(storage_url):
    add_study(storage_url, "rescored", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2},
              reruns={"top": 1, "seeds": 1}, training=SUBSET)
    finals = {}
    for family, tuned, rerun in (("lstm", 2.0, 1.0), ("mogrifier", 2.1, 1.1)):
        rescore(storage_url, trial(storage_url, "rescored", family, "COMPLETE", tuned), tuned + 0.2)
        finals[family] = trial(storage_url, "rescored", family, "COMPLETE", rerun, stage="rerun")
    found = comparison(storage_url, "rescored")
    assert found.winner is None and found.tuning_validation == "subset of 2,000 tokens"
    assert found.verdict == "no winner: 0 of 2 final models scored on the full validation set"
    assert found.families[0].best_tuning_full == pytest.approx(math.exp(2.2))
    rescore(storage_url, finals["lstm"], 1.5)
    rescore(storage_url, finals["mogrifier"], 1.4)  # better than lstm on the whole set, worse on the subset
    found = comparison(storage_url, "rescored")
    assert found.winner == "mogrifier" and "rescored after tuning" in found.winner_by
    assert [r.valid_from for r in found.families] == ["full rescoring", "full rescoring"]
    text = command(storage_url, "compare", "rescored")
    assert "best tuning run (val, subset of 2,000 tokens)" in text
    assert row(text, "lstm")[1] == f"{math.exp(2.0):.2f}; full {math.exp(2.2):.2f}" and "†" not in text


def test_without_reruns_single_tuning_runs_are_compared_and_every_family_shown(storage_url):
    add_study(storage_url, "single", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    trial(storage_url, "single", "lstm", "COMPLETE", 2.0)
    trial(storage_url, "single", "mogrifier", "FAIL")
    found = comparison(storage_url, "single")
    assert found.winner is None and found.verdict.startswith("no winner yet: 2 of 4 tuning trials finished")
    assert "single tuning runs" in found.verdict
    trial(storage_url, "single", "lstm", "PRUNED")
    trial(storage_url, "single", "mogrifier", "FAIL")
    found = comparison(storage_url, "single")
    assert found.winner == "lstm" and "no reruns" in found.winner_by and not found.has_reruns
    text = command(storage_url, "compare", "single")
    assert row(text, "mogrifier")[1:3] == ["no result yet", "-"] and "winner: lstm" in text
    assert "single tuning runs (no reruns in the spec: no mean over seeds)" in " ".join(text.split())  # (a title)
    assert found.margin is None and "ahead of" not in found.verdict  # no runner-up
    trial(storage_url, "single", "mogrifier", "COMPLETE", 2.5)  # a fifth trial, beyond the plan: now a runner-up
    found = comparison(storage_url, "single")
    assert found.margin.seeds == (1, 1) and found.margin.low is None
    assert found.verdict.endswith(f"ahead of mogrifier by {math.exp(2.5) - math.exp(2.0):.3f} perplexity (one seed "
                                  f"each): no interval of the difference can be drawn (Welch's t needs two seeds or "
                                  f"more of each, with some spread), so nothing here measures whether other seeds "
                                  f"would keep this order")
    payload = json.loads(command(storage_url, "compare", "single", "--json"))
    assert payload["margin"] == {"runner_up": "mogrifier", "difference": pytest.approx(math.exp(2.5) - math.exp(2.0)),
                                 "low": None, "high": None, "seeds": [1, 1]}


def test_export_writes_every_metric_of_every_trial(storage_url):
    add_study(storage_url, "exported", status="complete")
    best = trial(storage_url, "exported", "lstm", "COMPLETE", 2.0)
    trial(storage_url, "exported", "lstm", "PRUNED")
    with sessions(storage_url).begin() as session:
        for turn, val_loss in ((1, 2.5), (2, 2.0)):
            session.add(TurnRecord(trial_id=best, turn=turn, step=4 * turn, train_loss=val_loss + 0.1,
                                   val_loss=val_loss, best_val_loss=2.0, tokens_per_second=100.0,
                                   wall_seconds=3.0 * turn, learning_rate=0.003))
        session.add(EvaluationRecord(trial_id=best, kind="deterministic", valid_loss=1.9, test_loss=1.95,
                                     logit_scale=0.95, settings={"bptt": 10}))
        session.add(EvaluationRecord(trial_id=best, kind="mc", valid_loss=1.85, test_loss=1.9, logit_scale=1.0,
                                     settings={"mc_samples": 2, "grid": [0.9, 1.0]}))
    frame = export_frame(storage_url, "exported")
    assert list(frame["state"]) == ["COMPLETE", "PRUNED"] and set(frame["value_validation_set"]) == {"full"}
    first = frame.iloc[0]
    assert first["eval.deterministic.valid_loss"] == 1.9
    assert first["eval.mc.test_perplexity"] == pytest.approx(math.exp(1.9))
    assert first["eval.mc.settings.mc_samples"] == 2 and first["eval.mc.settings.grid"] == "[0.9, 1.0]"
    assert (first["last.turn"], first["last.val_loss"], first["last.wall_seconds"]) == (2, 2.0, 6.0)
    assert first["interrupted"] == False  # noqa: E712 (a column of the trial record beyond the view's)
    assert pandas.isna(frame.iloc[1]["last.turn"]) and pandas.isna(frame.iloc[1]["eval.mc.valid_loss"])

    written = pandas.read_csv(io.StringIO(command(storage_url, "export", "exported")))
    assert list(written.columns) == list(frame.columns)
    records = json.loads(command(storage_url, "export", "exported", "--format", "json"))
    assert records[0]["eval.deterministic.logit_scale"] == 0.95 and records[0]["last.learning_rate"] == 0.003


def test_export_writes_into_new_folders_and_refuses_a_folder_as_its_file(sqlite_url, tmp_path):
    add_study(sqlite_url, "exported", status="complete")
    trial(sqlite_url, "exported", "lstm", "COMPLETE", 2.0)
    nested = tmp_path / "new" / "folders" / "trials.csv"
    assert "wrote 1 trials to" in command(sqlite_url, "export", "exported", "-o", str(nested))
    assert len(pandas.read_csv(nested)) == 1
    refused = CliRunner().invoke(app, ["export", "exported", "-o", str(tmp_path), "--storage", sqlite_url])
    assert refused.exit_code == 2 and f"--output: {tmp_path} is a folder; give a file name" in refused.output


def test_export_refuses_a_file_it_cannot_write_before_reading_the_study(sqlite_url, tmp_path):
    """Where no file can be made whatever the permission bits say (root passes them): a folder of /proc, and a file
    there that takes no writes. Each used to fail at the end of the work with a bare traceback."""
    for unwritable in ("/proc/trials.csv", "/proc/version"):
        refused = CliRunner().invoke(app, ["export", "absent", "-o", unwritable, "--storage", sqlite_url],
                                     env={"COLUMNS": "250"})
        assert refused.exit_code == 2, refused.output  # 1 would be "no such study": the study was not read first
        assert f"error: --output: cannot write {unwritable} (" in refused.output
    kept = tmp_path / "kept.csv"
    kept.write_text("earlier rows\n")
    CliRunner().invoke(app, ["export", "absent", "-o", str(kept), "--storage", sqlite_url])
    assert kept.read_text() == "earlier rows\n"
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".lm-tuner")]  # the check left no file



def test_best_refuses_a_download_folder_it_cannot_write_before_copying(sqlite_url, tmp_path):
    add_study(sqlite_url, "kept", status="complete")
    trial(sqlite_url, "kept", "lstm", "COMPLETE", 2.0)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    for folder, problem in ((a_file, f"{a_file} is a file; give a folder"),
                            (a_file / "inside", f"cannot make the folder {a_file / 'inside'} (Not a directory)"),
                            (Path("/proc"), "cannot write in the folder /proc (")):  # root passes its permission bits
        result = CliRunner().invoke(app, ["best", "kept", "--storage", sqlite_url, "--download", str(folder)],
                                    env={"COLUMNS": "250"})
        assert result.exit_code == 2 and f"error: --download: {problem}" in result.output, result.output
