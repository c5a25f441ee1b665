"""The verdict names its budget: each family's best at equal training tokens and at equal compute, read from the
study's compute account, in `tuner compare` (and --json), GET /studies/{name}/comparison and the comparison page;
a winner only where the seeds separate it (else what more trials would buy); none for a study of one family.
Trials and turns are written directly (no Ray, no training), so that the verdicts are certain."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import httpx
import pandas as pd
import pytest
from sqlalchemy import delete

from lm_tuner.dashboards import budget_curves_figure, pareto_figure
from lm_tuner.tuner.analysis import compute_account
from lm_tuner.tuner.analysis.budget_sentences import amount
from lm_tuner.tuner.analysis.comparison import comparison
from lm_tuner.tuner.analysis.compute_account import Spend, compute_unit, study_account
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord, utcnow
from tests.conftest import serve_app
from tests.test_progress import add_study
from tests.test_reports import TWO_FAMILIES, command, row, trial

# Per family, its tuning turns in the order recorded: (trial, the trial's tokens so far, its CPU core-seconds so far,
# validation loss). Both families train on 4,000 tokens; the LSTM at 1,000 tokens per core-second, the Mogrifier at
# 500 with better losses per token: it wins at equal tokens (4.3 < 4.5), the LSTM at equal compute (4 core-seconds:
# the Mogrifier's best by then is 4.7).
TURNS = {"lstm": [(0, 1000, 1.0, 5.0), (1, 1000, 1.0, 4.9), (0, 2000, 2.0, 4.6), (1, 2000, 2.0, 4.5)],
         "mogrifier": [(0, 1000, 2.0, 4.8), (1, 1000, 2.0, 4.7), (0, 2000, 4.0, 4.4), (1, 2000, 4.0, 4.3)]}
FLIP = ("mogrifier wins at equal tokens, lstm at equal compute: mogrifier trains at 0.50x lstm's tokens per CPU "
        "core-second")
RERUNS = {"lstm": [4.50, 4.52, 4.51], "mogrifier": [4.30, 4.31, 4.32]}  # the seeds separate the Mogrifier
PER_MODEL = {"lstm": (2000, 2.0), "mogrifier": (2000, 4.0)}  # tokens and core-seconds of each final model


def tuned(url: str, study: str, turns: dict[str, list[tuple]] = TURNS) -> dict[str, list[int]]:
    """The families' tuning trials, complete, with their turns recorded one second apart (families interleaved)."""
    ids = {family: [trial(url, study, family, "COMPLETE",
                          min((t[3] for t in rows if t[0] == number and math.isfinite(t[3])), default=None))
                    for number in sorted({t[0] for t in rows})] for family, rows in turns.items()}
    start = utcnow() - timedelta(hours=1)
    with sessions(url).begin() as session:
        for position in range(max(len(rows) for rows in turns.values())):
            for offset, (family, rows) in enumerate(turns.items()):
                if position >= len(rows):
                    continue
                number, tokens, seconds, loss = rows[position]
                trial_id = ids[family][number]
                turn = 1 + sum(1 for earlier in rows[:position] if earlier[0] == number)
                session.add(TurnRecord(
                    trial_id=trial_id, turn=turn, step=turn, train_loss=loss, val_loss=loss, best_val_loss=loss,
                    tokens_per_second=1.0, wall_seconds=seconds, tokens=tokens, compute_seconds=seconds,
                    reported_at=start + timedelta(seconds=2 * position + offset)))
                record = session.get(TrialRecord, trial_id)
                record.tokens, record.compute_seconds = tokens, seconds
    return ids


def rerun(url: str, study: str, values: dict[str, list[float]] = RERUNS) -> None:
    for family, losses in values.items():
        for loss in losses:
            trial_id = trial(url, study, family, "COMPLETE", loss, stage="rerun")
            with sessions(url).begin() as session:
                record = session.get(TrialRecord, trial_id)
                record.tokens, record.compute_seconds = PER_MODEL[family]


def flip_study(url: str, name: str = "flip") -> None:
    """A finished study whose verdict flips between equal tokens and equal compute, with three reruns a family."""
    add_study(url, name, status="complete", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2},
              reruns={"top": 1, "seeds": 3})
    tuned(url, name)
    rerun(url, name)


def test_a_verdict_that_flips_between_tokens_and_compute_shows_both_winners_everywhere(storage_url, tmp_path):
    flip_study(storage_url)
    found = comparison(storage_url, "flip")
    assert (found.winner_at_equal_tokens, found.winner_at_equal_compute) == ("mogrifier", "lstm")
    assert (found.equal_tokens, found.equal_compute_seconds, found.compute_unit) == (4000, 4.0, "CPU core-seconds")
    lstm, mogrifier = found.families
    assert (lstm.tokens, lstm.compute_seconds, lstm.tokens_per_second) == (4000, 4.0, 1000.0)
    assert (mogrifier.tokens, mogrifier.compute_seconds, mogrifier.tokens_per_second) == (4000, 8.0, 500.0)
    assert (lstm.best_at_equal_tokens, lstm.best_at_equal_compute) == pytest.approx((math.exp(4.5), math.exp(4.5)))
    # the Mogrifier is credited with its turns up to 4.2 core-seconds: its 4.3 came at 8
    assert (mogrifier.best_at_equal_tokens, mogrifier.best_at_equal_compute) == pytest.approx(
        (math.exp(4.3), math.exp(4.7)))
    assert found.budget_verdict == (f"{FLIP} (at 4.00k tokens each: mogrifier 73.70, lstm 90.02; at 4 CPU "
                                    f"core-seconds each: lstm 90.02, mogrifier 109.95)")
    # the reruns separate the Mogrifier; its final models trained on the same tokens as the LSTM's, not the same
    # compute: the winner says so
    assert found.winner == "mogrifier" and found.margin.separated
    assert found.winner_holds_at == ("equal tokens (2.00k tokens each) and unequal compute (2 CPU core-seconds for "
                                     "lstm to 4 CPU core-seconds for mogrifier) per model")
    assert found.verdict.startswith(f"winner: mogrifier at {found.winner_holds_at}, by the mean validation")
    assert (mogrifier.final_tokens, mogrifier.final_compute_seconds) == (2000, 4.0)

    text = " ".join(command(storage_url, "compare", "flip").split())
    assert f"at equal budgets: {found.budget_verdict}" in text
    assert f"winner: mogrifier at {found.winner_holds_at}" in text
    assert budget_row(command(storage_url, "compare", "flip"), "mogrifier") == ["4.00k", "8", "500", "73.70",
                                                                                "109.95"]
    payload = json.loads(command(storage_url, "compare", "flip", "--json"))
    assert (payload["winner_at_equal_tokens"], payload["winner_at_equal_compute"]) == ("mogrifier", "lstm")
    assert (payload["equal_tokens"], payload["equal_compute_seconds"]) == (4000, 4.0)
    assert payload["families"][1]["best_at_equal_compute"] == pytest.approx(math.exp(4.7))
    assert payload["families"][0]["tokens_per_second"] == 1000.0 and payload["budget_verdict"] == found.budget_verdict

    with serve_app(Settings(storage_url, tmp_path / "artifacts")) as base, httpx.Client(base_url=base) as client:
        served = client.get("/studies/flip/comparison").json()
        page = client.get("/dashboard/studies/flip/comparison").text
        curves = client.get("/studies/flip/budget-curves").json()
        pareto = client.get("/studies/flip/pareto").json()
    assert {key: served[key] for key in payload if key != "unigram_baseline"} == {
        key: value for key, value in payload.items() if key != "unigram_baseline"}
    assert 'id="winner-at-equal-tokens">mogrifier</b>' in page and 'id="winner-at-equal-compute">lstm</b>' in page
    assert f'<span id="budget-verdict">{found.budget_verdict}</span>' in page.replace("&#39;", "'")
    assert 'id="winner">mogrifier</b>' in page and "best at equal compute (4 CPU core-seconds)" in page
    assert (curves["equal_tokens"], curves["equal_compute_seconds"]) == (4000, 4.0)
    assert [f["tokens_per_second"] for f in curves["families"]] == [1000.0, 500.0]
    drawn = {(t["name"], t.get("xaxis", "x")): t for t in curves["figure"]["data"]}
    assert drawn[("mogrifier (500 tokens per core-second)", "x2")]["x"] == [2.0, 4.0, 6.0, 8.0]
    assert drawn[("mogrifier (500 tokens per core-second)", "x2")]["y"] == pytest.approx(
        [math.exp(v) for v in (4.8, 4.7, 4.4, 4.3)])
    # the Pareto front's default cost is compute: the trials' own core-seconds
    assert pareto["x"] == "compute"
    assert pareto["figure"]["layout"]["xaxis"]["title"]["text"] == "compute (CPU core-seconds)"
    assert sorted(point["x"] for point in pareto["non_dominated"]) == [2.0, 4.0]


def test_a_study_of_one_family_names_no_winner(storage_url, tmp_path):
    add_study(storage_url, "alone", status="complete")  # lstm alone
    tuned(storage_url, "alone", {"lstm": TURNS["lstm"]})
    found = comparison(storage_url, "alone")
    expected = "one family (lstm): nothing to compare it with, so no winner"
    assert found.winner is None and found.verdict == expected and found.winner_holds_at is None
    assert (found.winner_at_equal_tokens, found.winner_at_equal_compute) == (None, None)
    assert found.budget_verdict == "one family: nothing to compare at equal budgets"
    assert found.families[0].best_at_equal_tokens == pytest.approx(math.exp(4.5))  # its own numbers still shown
    text = command(storage_url, "compare", "alone")
    assert "winner:" not in text and expected in " ".join(text.split())
    with serve_app(Settings(storage_url, tmp_path / "artifacts")) as base:
        served = httpx.get(f"{base}/studies/alone/comparison").json()
        page = httpx.get(f"{base}/dashboard/studies/alone/comparison").text
    assert served["winner"] is None and served["verdict"] == expected
    assert 'id="winner"' not in page and f'<span id="verdict">{expected}</span>' in page
    assert 'id="winner-at-equal-tokens">none</b>' in page


def test_reruns_that_do_not_separate_the_families_name_no_clear_winner(storage_url):
    add_study(storage_url, "close", status="complete", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2},
              reruns={"top": 1, "seeds": 3})
    tuned(storage_url, "close")
    rerun(storage_url, "close", {"lstm": [4.50, 4.60, 4.40], "mogrifier": [4.45, 4.55, 4.50]})
    found = comparison(storage_url, "close")
    assert found.winner is None and found.winner_holds_at is None
    assert found.margin.low < 0 < found.margin.high  # the 95% interval of the difference holds 0
    assert found.verdict.startswith("no clear winner at this budget: mogrifier is ahead of lstm by ")
    assert "the seeds do not separate them" in found.verdict
    # what more trials would buy, by the tuning curves: Dodge et al.'s expected best of n draws from the two trials,
    # at n = 2 (3/4 the better, 1/4 the worse) and n = 4 (15/16, 1/16)
    better, worse = math.exp(4.5), math.exp(4.6)
    assert (f"twice the tuning trials would take lstm from {0.75 * better + 0.25 * worse:.2f} to "
            f"{15 / 16 * better + worse / 16:.2f} (n = 2 → 4)") in found.verdict
    text = " ".join(command(storage_url, "compare", "close").split())
    assert "winner:" not in text and "no clear winner at this budget" in text
    assert found.budget_verdict.startswith(FLIP)  # the tuning account is the flip study's


def test_without_reruns_the_single_run_winner_must_be_the_account_s(storage_url):
    """Single tuning runs are the account's own scores: the best of them is named only where it also wins at equal
    tokens and at equal compute, with the caveat that no interval can be drawn."""
    add_study(storage_url, "single", status="complete", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    tuned(storage_url, "single")
    found = comparison(storage_url, "single")
    assert found.winner is None and found.budget_verdict.startswith(FLIP)
    assert found.verdict == ("no winner: mogrifier has the best single tuning run, but the tuning account favours "
                             "lstm at equal compute (no reruns in the spec to settle it)")

    add_study(storage_url, "agreed", status="complete", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    tuned(storage_url, "agreed", {"lstm": TURNS["lstm"],  # the Mogrifier as fast as the LSTM now
                                  "mogrifier": [(n, tokens, tokens / 1000, loss) for n, tokens, _, loss in
                                                TURNS["mogrifier"]]})
    found = comparison(storage_url, "agreed")
    assert found.winner == "mogrifier" and found.budget_verdict.startswith(
        "mogrifier wins at equal tokens and at equal compute (at 4.00k tokens each")
    assert found.winner_holds_at == ("equal tokens (4.00k tokens each) and equal compute (4 CPU core-seconds each) "
                                     "in tuning")
    assert "no interval of the difference can be drawn" in found.verdict


def test_turns_recorded_before_the_account_leave_the_budgets_unknown(storage_url):
    add_study(storage_url, "old", status="complete", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    ids = tuned(storage_url, "old")
    with sessions(storage_url).begin() as session:  # as migration 0011 left the rows written before it
        for turn in session.query(TurnRecord).filter(TurnRecord.trial_id.in_(ids["lstm"])):
            turn.tokens = turn.compute_seconds = turn.reported_at = None
    found = comparison(storage_url, "old")
    assert (found.equal_tokens, found.equal_compute_seconds) == (None, None)
    assert (found.winner_at_equal_tokens, found.winner_at_equal_compute) == (None, None)
    assert found.families[0].tokens is None and found.families[1].tokens == 4000
    unknown = "lstm recorded turns without it (before the compute account was kept)"
    assert found.budget_verdict == f"no winner at equal tokens: {unknown}; no winner at equal compute: {unknown}"
    # the account cannot contradict the best single run, and cannot confirm it: the winner says so
    assert found.winner == "mogrifier" and found.winner_holds_at.startswith("a budget not compared (at equal tokens: ")
    assert budget_row(command(storage_url, "compare", "old"), "lstm") == ["unknown", "unknown", "-", "-", "-"]


def budget_row(text: str, family: str) -> list[str]:
    """The cells of a family's row in the table of budgets (the last table), after its name."""
    return row(text.split("tuning at equal budgets")[1], family)[1:]


def test_a_family_is_credited_up_to_five_percent_beyond_the_least_spend(storage_url):
    add_study(storage_url, "tolerant", status="complete", families=["lstm", "mogrifier", "rlstm"],
              fixed={"num_layers": 1, "mogrifier_rounds": 2, "mogrifier_rank": 2})
    tuned(storage_url, "tolerant", {"lstm": [(0, 1000, 1.0, 3.0), (0, 2000, 2.0, 2.0)],
                                    "mogrifier": [(0, 1000, 1.0, 2.9), (0, 2040, 2.0, 1.5)],  # 2% more: whole
                                    "rlstm": [(0, 1000, 1.0, 2.9), (0, 2200, 2.0, 1.5)]})  # 10% more: not its last
    found = study_account(storage_url, "tolerant")
    assert found.tokens.point == 2000 and found.tokens.best == {"lstm": 2.0, "mogrifier": 1.5, "rlstm": 2.9}
    assert found.tokens.winner == "mogrifier" and found.compute.best == {"lstm": 2.0, "mogrifier": 1.5, "rlstm": 1.5}


def test_a_family_without_a_score_by_the_equal_point_is_named_and_none_wins_there(storage_url):
    add_study(storage_url, "late", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2})
    tuned(storage_url, "late", {"lstm": [(0, 1000, 1.0, 4.0)], "mogrifier": [(0, 1000, 3.0, 3.0)]})
    found = comparison(storage_url, "late")
    assert (found.winner_at_equal_tokens, found.winner_at_equal_compute) == ("mogrifier", None)
    assert found.budget_verdict.startswith("mogrifier wins at equal tokens; no winner at equal compute: mogrifier "
                                           "had no validation score by then (at 1.00k tokens each")
    assert found.budget_verdict.endswith("at 1 CPU core-seconds each: lstm 54.60, mogrifier no score)")


def test_the_account_sums_what_each_trial_reported_and_counts_running_and_resumed_trials(storage_url):
    add_study(storage_url, "summed", status="running")
    ids = tuned(storage_url, "summed", {"lstm": [
        (0, 1000, 1.0, math.inf),  # a diverged turn spends, scores nothing
        (1, 500, 0.5, 4.0),  # another trial, still running
        (0, 2000, 2.0, 4.5),  # no better: not a corner of the curve
        (0, 1800, 1.9, 3.5),  # trial 0 resumed from an older checkpoint: counted on from the most it reported
        (0, 2600, 2.5, 3.0)]})
    with sessions(storage_url).begin() as session:
        session.get(TrialRecord, ids["lstm"][1]).state = "RUNNING"
    (account,) = study_account(storage_url, "summed").families
    assert [(c.tokens, c.compute, c.best_loss) for c in account.corners] == [
        (1500, 1.5, 4.0), (2500, 2.5, 3.5), (3100, 3.0, 3.0)]  # where the best improved; the last turn
    assert account.best_within("tokens", 1400) is None and account.best_within("compute", 2.6) == 3.5
    assert account.tokens_per_second == pytest.approx(3100 / 3.0)


def test_the_account_follows_new_turns_and_starts_over_when_a_turn_is_reported_again(storage_url):
    """The account is kept between calls and read on from the last turn it saw; the recorder's retry of a turn (its row
    deleted and written again) makes it start over, so that it always equals the database's turns."""
    add_study(storage_url, "growing", status="running", **TWO_FAMILIES, tuning={"trials": 2, "concurrency": 2})
    lstm = tuned(storage_url, "growing")["lstm"][0]
    assert study_account(storage_url, "growing").families[0].corners[-1] == Spend(4000, 4.0, 4.5)

    def report(loss: float) -> None:
        with sessions(storage_url).begin() as session:  # as tuner.run.recorder records a turn
            session.execute(delete(TurnRecord).where(TurnRecord.trial_id == lstm, TurnRecord.turn == 3))
            session.add(TurnRecord(trial_id=lstm, turn=3, step=3, train_loss=loss, val_loss=loss, best_val_loss=loss,
                                   tokens_per_second=1.0, wall_seconds=3.0, tokens=3000, compute_seconds=3.0))

    kept = list(compute_account._LEDGERS.values())[-1]
    report(4.0)
    assert study_account(storage_url, "growing").families[0].corners[-2:] == [Spend(4000, 4.0, 4.5),
                                                                              Spend(5000, 5.0, 4.0)]
    assert list(compute_account._LEDGERS.values())[-1] is kept  # read on, not again from the first turn
    report(4.9)  # retried from its checkpoint: the 4.0 is gone
    (again, _) = study_account(storage_url, "growing").families
    assert again.corners[-1] == Spend(5000, 5.0, 4.5) and again.best_within("tokens", 1e9) == 4.5


def test_gpu_trials_count_gpu_seconds():
    assert compute_unit({"resources": {"gpus_per_trial": 0.5}}) == "GPU-seconds"
    assert compute_unit({"resources": {"cpus_per_trial": 2}}) == compute_unit({}) == "CPU core-seconds"
    assert amount("compute", 7200.4, "GPU-seconds") == "7,200 GPU-seconds"
    assert [amount("tokens", n, "") for n in (960, 84_000, 1_204_000, 929e6, None)] == [
        "960 tokens", "84.00k tokens", "1.20M tokens", "929M tokens", "unknown"]


def test_the_budget_figure_draws_each_family_against_both_budgets_with_the_equal_points():
    curves = pd.DataFrame({"family": ["lstm", "lstm", "mogrifier"], "tokens": [1000.0, 2000.0, 1000.0],
                           "compute_seconds": [1.0, 2.0, float("nan")], "score": [90.0, 80.0, 85.0]})
    figure = budget_curves_figure(curves, families=["lstm", "mogrifier"], rates={"lstm": 1000.0, "mogrifier": None},
                                  equal_tokens=1000.0, equal_compute=None, compute_unit="GPU-seconds",
                                  y_title="validation perplexity")
    traces = {(trace.name, trace.xaxis): trace for trace in figure.data}
    assert list(traces[("lstm (1,000 tokens per GPU-second)", "x2")].x) == [1.0, 2.0]
    assert list(traces[("mogrifier", "x2")].x) == [] and list(traces[("mogrifier", "x")].y) == [85.0]
    assert traces[("lstm (1,000 tokens per GPU-second)", "x")].line.shape == "hv"
    assert [(shape.xref, shape.x0) for shape in figure.layout.shapes] == [("x", 1000.0)]
    assert figure.layout.xaxis2.title.text == "GPU-seconds spent by the family's tuning"
    empty = budget_curves_figure(curves.iloc[:0], families=["lstm"], rates={}, equal_tokens=None,
                                 equal_compute=None, compute_unit="CPU core-seconds", y_title="bpc")
    assert empty.layout.title.text.endswith(": no tuning turn has reported a score with its tokens and compute yet")


def test_the_pareto_figure_puts_compute_first_and_says_when_no_trial_has_it():
    trials = pd.DataFrame({"family": ["lstm", "lstm"], "number": [0, 1], "trial_id": [1, 2], "perplexity": [90.0, 95],
                           "compute_seconds": [float("nan"), 3.0], "parameter_count": [1000, 1000]})
    figure = pareto_figure(trials)
    assert figure.layout.xaxis.title.text == "compute (device-seconds)" and list(figure.data[0].x) == [3.0]
    unknown = pareto_figure(trials.iloc[:1])  # ran before the compute account was kept
    assert "no finished trial has its compute (device-seconds) recorded" in unknown.layout.title.text
    assert "recorded" not in pareto_figure(trials.iloc[:1], x="parameter_count").layout.title.text
