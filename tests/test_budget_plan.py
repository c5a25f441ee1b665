"""The split of a study's compute budget (issue 40): the spec section, the rungs every family gets, equal tokens or
equal compute, a budget too small for its rungs, the expected end, and the sampler that learns from the rungs."""

from __future__ import annotations

import optuna
import pytest
import yaml

from lm_tuner.tuner.run.rung_sampler import RungSampler
from lm_tuner.tuner.spec import SpecError, parse_spec
from lm_tuner.tuner.spec.budget_plan import BudgetTooSmall, FamilySpeed, family_steps, plan_budget
from lm_tuner.tuner.spec.estimate import ProbeTiming
from tests.conftest import TINY_SPEC

SPEEDS = [FamilySpeed("lstm", step_wall=0.1, step_device=0.1, evaluation_wall=2.0, evaluation_device=2.0),
          FamilySpeed("mogrifier", step_wall=0.2, step_device=0.2, evaluation_wall=2.0, evaluation_device=2.0)]


LSTM_ONLY = {"families": ["lstm"], "fixed": {"num_layers": 1},
             "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}


def budgeted(budget: dict | None = None, **fields) -> str:
    training = {"steps_per_turn": 50, "batch_size": 32, "bptt": 35, "eval_batch_size": 4, **fields.pop("training", {})}
    return yaml.safe_dump({**TINY_SPEC, "training": training, "tuning": {"sampler": "tpe", "concurrency": 2},
                           "compute_budget": budget or {"core_hours": 1.0}, **fields}, sort_keys=False)


def test_the_budget_decides_the_configurations_and_refuses_other_bounds() -> None:
    spec = parse_spec(budgeted({"core_hours": 2, "rungs": 3, "reduction_factor": 2, "finalists": 2}))
    assert spec.tuning.trials == 8  # 2 finalists x 2^(3 - 1): what status, progress and compare count
    assert "compute_budget" not in parse_spec(yaml.safe_dump(TINY_SPEC)).model_dump(mode="json")  # stored specs
    refusals = {
        "compute_budget": ({"core_hours": 1, "wall_minutes": 3}, {}, "give exactly one of core_hours, gpu_hours"),
        "training.turns": ({"core_hours": 1}, {"training": {"turns": 3}}, "decides how far each trial trains"),
        "tuning.trials": ({"core_hours": 1, "rungs": 3}, {"tuning": {"trials": 3}}, "tries 9 configurations"),
        "early_stopping.method": ({"core_hours": 1}, {"early_stopping": {"method": "asha"}}, "stops configurations"),
        "compute_budget.gpu_hours": ({"gpu_hours": 1}, {}, "the trials hold no GPU"),
    }
    for field, (budget, fields, words) in refusals.items():
        with pytest.raises(SpecError) as refused:
            parse_spec(budgeted(budget, **fields))
        assert f"{field}: " in str(refused.value) and words in str(refused.value), field
    with pytest.raises(SpecError, match="tuning.trials: required"):
        parse_spec(yaml.safe_dump({**TINY_SPEC, "tuning": {"sampler": "gp"}}))


def test_equal_tokens_gives_every_family_the_same_rungs_and_spends_the_budget() -> None:
    spec = parse_spec(budgeted({"core_hours": 1, "rungs": 3}))
    plan = plan_budget(spec, SPEEDS, parallel_trials=2)
    lstm, mogrifier = plan.families
    assert [r.steps for r in lstm.rungs] == [r.steps for r in mogrifier.rungs]
    assert [r.configurations for r in lstm.rungs] == [9, 3, 1]
    assert all(r.steps % 50 == 0 for r in lstm.rungs)  # a rung ends on a turn's evaluation
    low, middle, top = (r.steps for r in lstm.rungs)
    assert middle / low == pytest.approx(3, rel=0.1) and top / middle == pytest.approx(3, rel=0.05)
    assert lstm.tokens == mogrifier.tokens == family_steps(lstm.rungs) * 32 * 35
    # the slower family costs more at equal tokens; together they spend the budget (up to rounding to turns)
    assert mogrifier.device_seconds > lstm.device_seconds
    assert lstm.device_seconds + mogrifier.device_seconds == pytest.approx(3600, rel=0.03)


def test_equal_compute_gives_the_faster_family_more_tokens_for_the_same_seconds() -> None:
    plan = plan_budget(parse_spec(budgeted({"core_hours": 1, "equal": "compute"})), SPEEDS, parallel_trials=2)
    lstm, mogrifier = plan.families
    assert lstm.device_seconds == pytest.approx(mogrifier.device_seconds, rel=0.03)
    assert lstm.tokens > 1.5 * mogrifier.tokens
    assert [r.configurations for r in lstm.rungs] == [r.configurations for r in mogrifier.rungs] == [3, 1]


def test_wall_minutes_count_every_slot_and_the_expected_end_follows_the_rungs() -> None:
    spec = parse_spec(budgeted({"wall_minutes": 30}))
    alike = [SPEEDS[0], FamilySpeed("mogrifier", 0.1, 0.1, 2.0, 2.0)]
    plan = plan_budget(spec, alike, parallel_trials=2)
    assert plan.budget_seconds == 2 * 30 * 60
    # two slots kept busy by two families of one speed: the study ends about when the budget says
    assert plan.expected_seconds == pytest.approx(30 * 60, rel=0.1)
    # a family twice as slow at equal tokens waits on its own last rung: later, and said
    assert plan_budget(spec, SPEEDS, parallel_trials=2).expected_seconds > 1.1 * 30 * 60
    alone = plan_budget(parse_spec(budgeted({"wall_minutes": 30}, **LSTM_ONLY)), SPEEDS[:1],
                        parallel_trials=2)
    # one family's last rung has one configuration: one slot idles while it trains, and the plan says so
    assert alone.expected_seconds > 1.2 * 30 * 60


def test_a_budget_too_small_for_its_rungs_names_the_smallest_that_is_enough() -> None:
    spec = parse_spec(budgeted({"core_hours": 0.001, "rungs": 3}))
    with pytest.raises(BudgetTooSmall, match=r"compute_budget: 0.001 core-hours buys .* give at least ([0-9.]+) "
                                             r"core-hours") as refused:
        plan_budget(spec, SPEEDS, parallel_trials=2)
    enough = float(refused.value.args[0].split("give at least ")[1].split(" ")[0])
    assert plan_budget(parse_spec(budgeted({"core_hours": enough * 1.01, "rungs": 3})), SPEEDS, parallel_trials=2)


def test_reruns_are_paid_from_the_budget() -> None:
    without = plan_budget(parse_spec(budgeted({"core_hours": 1})), SPEEDS, parallel_trials=2)
    with_reruns = plan_budget(parse_spec(budgeted({"core_hours": 1}, reruns={"top": 1, "seeds": 3})), SPEEDS,
                              parallel_trials=2)
    assert with_reruns.reruns == 3
    assert with_reruns.families[0].rungs[-1].steps < 0.6 * without.families[0].rungs[-1].steps


def test_family_speeds_count_device_seconds_of_cpu_time_or_gpus() -> None:
    from lm_tuner.tuner.spec.budget_plan import family_speeds

    timing = ProbeTiming(step_seconds=0.5, evaluation_seconds_per_token=1e-4, cpu_per_wall=1.8)
    (cpu,) = family_speeds(parse_spec(budgeted(**LSTM_ONLY)), {"lstm": timing}, valid_tokens=100_000)
    assert (cpu.step_wall, cpu.step_device) == (0.5, pytest.approx(0.9))
    gpu_spec = parse_spec(budgeted({"gpu_hours": 1}, resources={"gpus_per_trial": 0.5}, **LSTM_ONLY))
    (gpu,) = family_speeds(gpu_spec, {"lstm": timing}, valid_tokens=100_000)
    assert gpu.step_device == pytest.approx(0.25)


def test_the_plan_counts_device_seconds_in_the_unit_its_trials_hold(capsys: pytest.CaptureFixture[str]) -> None:
    from lm_tuner.tuner.cli.budget_report import print_budget

    for resources, unit, column in (({"cpus_per_trial": 1}, "core-hours", "core-h"),
                                    ({"gpus_per_trial": 0.5}, "GPU-hours", "GPU-h")):
        plan = plan_budget(parse_spec(budgeted({"wall_minutes": 30}, resources=resources)), SPEEDS,
                           parallel_trials=2)
        assert plan.device_unit == unit
        print_budget(plan)
        header = next(line for line in capsys.readouterr().out.splitlines() if "tokens/s" in line)
        assert f" {column} " in header and {"core-h", "GPU-h"} - {column} & set(header.split()) == set()


def test_the_rung_sampler_learns_from_results_at_a_rung() -> None:
    """Configurations that wait at a rung (RUNNING, with a result at the rung's turn) are what the model is fitted
    to: the proposals close in on the best x although no trial is complete."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize")
    sampler = RungSampler(optuna.samplers.GPSampler(seed=1, n_startup_trials=4), rung_turns=[2, 6], enough=3)
    study.sampler = sampler
    space = {"x": optuna.distributions.FloatDistribution(-5, 5)}
    proposals = []
    for _ in range(14):
        trial = study.ask(space)
        proposals.append(trial.params["x"])
        study._storage.set_trial_intermediate_value(trial._trial_id, 2, (trial.params["x"] - 1) ** 2)
    assert all(trial.state == optuna.trial.TrialState.RUNNING for trial in study.trials)
    assert sum(abs(x - 1) < 0.5 for x in proposals[-5:]) >= 4
