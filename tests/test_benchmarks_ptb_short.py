"""Smoke tests of the PTB benchmarks on a tiny PTB-format fixture: they run and report the promised JSON."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from benchmarks import dynamic_evaluation_cost, ptb_short, validation_streams

WORDS = ["the", "a", "market", "rose", "fell", "N", "<unk>", "shares", "of", "in"]


@pytest.fixture(autouse=True)
def _process_settings_restored():
    """The benchmarks pin their process to cores and set thread counts, as they should when run; in the
    test process those settings would leak into every later test and the processes it starts."""
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    variables = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    yield
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def tiny_ptb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ptb")
    generator = random.Random(0)
    for split, lines in (("train", 400), ("valid", 60), ("test", 60)):
        text = "".join(" " + " ".join(generator.choices(WORDS, k=generator.randint(3, 12))) + " \n"
                       for _ in range(lines))
        (folder / f"ptb.{split}.txt").write_text(text)
    return folder


def test_ptb_short_reports_a_curve_per_model(tiny_ptb: Path, tmp_path: Path) -> None:
    output = tmp_path / "ptb_short.json"
    result = ptb_short.main(["--data", str(tiny_ptb), "--minutes", "0.03", "--threads", "1", "--eval-every", "0.5",
                             "--eval-tokens", "200", "--parameter-budget", "6000", "--reference-parameters", "5000",
                             "--output", str(output)])
    assert output.is_file()
    assert set(result["machine"]) >= {"cpu", "logical_cpus", "torch_threads_per_model", "torch",
                                      "load_average_before", "load_average_after"}
    assert set(result["models"]) == set(ptb_short.MODELS)
    for record in result["models"].values():
        assert record["parameters"] <= 6000
        assert len(record["curve"]) >= 1
        assert {"wall_seconds", "cpu_seconds", "val_ppl"} <= set(record["curve"][0])
        summary = record["summary"]
        assert summary["at_end"]["val_ppl"] == record["curve"][-1]["val_ppl"]
        assert summary["full_valid_ppl_of_best_weights_at_end"] < len(WORDS) + 2


def test_ptb_short_refuses_parallel_runs_without_enough_cores(tiny_ptb: Path) -> None:
    with pytest.raises(SystemExit, match="need 3000 cores"):
        ptb_short.main(["--data", str(tiny_ptb), "--threads", "1000", "--parallel"])


def test_dynamic_evaluation_cost_reports_the_ratio(tiny_ptb: Path) -> None:
    result = dynamic_evaluation_cost.main(["--data", str(tiny_ptb), "--tokens", "60", "--repeats", "2",
                                           "--parameter-budget", "3000", "--threads", "1"])
    assert result["ratio_dynamic_to_static"] > 0
    assert len(result["seconds"]["dynamic"]) == 2
    assert result["gradient_rms_seconds"] > 0
    losses = result["loss_nats"]  # the floor pass scores the same segments with the same, unadapted, weights
    assert losses["gradients_only"] == pytest.approx(losses["static_same_segments"], rel=1e-6)
    assert result["ratio_gradients_only_to_static"] > 0


def test_ptb_short_overrides_reach_our_models(tiny_ptb: Path) -> None:
    result = ptb_short.main(["--data", str(tiny_ptb), "--minutes", "0.02", "--threads", "1", "--eval-every", "0.5",
                             "--eval-tokens", "200", "--parameter-budget", "6000", "--models", "lstm",
                             "--set", "batch_size=8", "--set", "input_embedding_ratio=0.5"])
    configuration = result["models"]["lstm"]["configuration"]
    assert configuration["training"]["schedule"]["batch_size"] == 8
    assert configuration["model"]["input_embedding_ratio"] == 0.5
    assert result["settings"]["overrides"] == {"batch_size": 8, "input_embedding_ratio": 0.5}


def test_ptb_short_refuses_unknown_overrides(tiny_ptb: Path) -> None:
    with pytest.raises(SystemExit):
        ptb_short.main(["--data", str(tiny_ptb), "--set", "learning_rat=0.1"])


def test_ptb_short_step_budget_trains_exactly_that_many_steps(tiny_ptb: Path) -> None:
    arguments = ["--data", str(tiny_ptb), "--steps", "6", "--steps-per-turn", "4", "--threads", "1",
                 "--eval-tokens", "200", "--parameter-budget", "6000", "--models", "lstm"]
    first, second = ptb_short.main(arguments), ptb_short.main(arguments)
    assert [point["step"] for point in first["models"]["lstm"]["curve"]] == [4, 6]
    assert first["settings"]["steps"] == 6 and first["settings"]["minutes"] is None
    assert first["models"]["lstm"]["full_valid_ppl"] == second["models"]["lstm"]["full_valid_ppl"]  # deterministic


def test_ptb_short_step_budget_leaves_the_wall_clock_reference_out(tiny_ptb: Path) -> None:
    with pytest.raises(SystemExit):
        ptb_short.main(["--data", str(tiny_ptb), "--steps", "6"])


def test_validation_streams_scores_every_stretch_at_every_stream_count(tiny_ptb: Path) -> None:
    result = validation_streams.main(["--data", str(tiny_ptb), "--steps", "3", "--threads", "1",
                                      "--stretch-tokens", "150", "--parameter-budget", "6000"])
    scores = {(score["stretch"], score["streams"]): score for score in result["scores"]}
    assert {stretch for stretch, _ in scores} == {"first", "middle", "last", "whole split"}
    assert ("first", 1) in scores and ("first", 4) in scores and ("first", 32) not in scores  # 4 tokens a stream
    assert all(score["ratio_to_one_stream"] == score["perplexity"] / scores[(score["stretch"], 1)]["perplexity"]
               for score in scores.values())
