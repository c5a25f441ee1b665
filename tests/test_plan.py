"""`tuner plan` and `POST /studies/plan`: solved shapes across the searched ranges, the parameter split, time
estimates from a probe, and the warnings that launch and POST /studies share (refusing what cannot learn)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import httpx
import pytest
import yaml

from lm_tuner.api.submission_checks import data_checks
from lm_tuner.models import FAMILIES, LanguageModel, ModelConfig, count_parameters
from lm_tuner.models.budget import parameter_breakdown
from lm_tuner.trainers import Schedule
from lm_tuner.tuner.cli.running import _print_warnings
from lm_tuner.tuner.run.probe import study_plan
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.estimate import CorpusSize, Machine, ProbeTiming, estimate_trial, with_estimates
from lm_tuner.tuner.spec.feasibility import submission_issues
from lm_tuner.tuner.spec.plan import corner_points, hidden_size_floor, plan_study, shaping_names
from lm_tuner.tuner.spec.shipped import shipped_space
from lm_tuner.tuner.spec.space import trial_setup
from tests.conftest import TINY_SPEC, serve_app
from tests.test_cli import tuner

REVERSE_COPY = {**TINY_SPEC, "name": "copy",
                "dataset": {"generator": "reverse-copy", "symbols": 10, "length": 20, "train_examples": 50,
                            "valid_examples": 10, "test_examples": 10}}


def spec_with(**fields):
    return parse_spec({**TINY_SPEC, **fields})


def with_bptt(document: dict, bptt: int) -> dict:
    return {**document, "training": {**document["training"], "bptt": bptt}}


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_breakdown_adds_up_to_the_count_for_every_family(family):
    mogrifier = family.startswith("mogrifier")
    for rounds, ratio, tied, components in itertools.product((0, 3) if mogrifier else (0,), (1.0, 0.4),
                                                             (True, False), (1, 2)):
        config = ModelConfig(vocab_size=50, hidden_size=16, family=family, input_embedding_ratio=ratio,
                             mogrifier_rounds=rounds, mogrifier_rank=2, tie_embeddings=tied,
                             softmax_components=components)
        parts = parameter_breakdown(config)
        assert parts["embedding"] + parts["recurrent"] + parts["softmax"] == parts["total"] == count_parameters(config)
        assert parts["embedding"] == 50 * config.embedding_size  # a tied embedding counts once, as embedding
        assert parts["recurrent"] == sum(p.numel() for p in LanguageModel(config).layers.parameters())


def test_plan_of_the_tiny_spec_solves_every_family_with_the_trials_solver():
    spec = spec_with()
    planned = plan_study(spec, vocab_size=20)
    assert [family.family for family in planned.families] == ["lstm", "mogrifier"]
    for family in planned.families:
        hidden = family.hidden_size
        assert hidden.min <= hidden.median <= hidden.max
        median = trial_setup(spec, family.family, family.median_point, 20, seed=0).model
        assert median.hidden_size == hidden.median and family.parameters == parameter_breakdown(median)
        assert family.parameters["total"] <= spec.parameter_budget and family.infeasible_points == 0
        assert family.trials == family.runs == 1
    lstm, mogrifier = planned.families
    assert lstm.hidden_size.min == lstm.hidden_size.max  # it searches nothing that changes its shape
    assert mogrifier.hidden_size.min < mogrifier.hidden_size.max  # 1 to 4 mogrifier rounds: fewer, wider
    assert planned.warnings == []  # hidden sizes 28 to 30, above the vocabulary's 20: the softmax has full rank


def test_the_hidden_size_warning_holds_a_model_to_its_vocabulary_up_to_128():
    """The demo (vocabulary 48) was warned that hidden sizes of 83 were below 128; a state as large as the vocabulary
    already gives the softmax full rank. Below the vocabulary size, and below 128 for larger vocabularies, it warns."""
    spec = spec_with()
    assert [hidden_size_floor(size) for size in (20, 48, 128, 10_000)] == [20, 48, 128, 128]
    (small,) = [w for w in plan_study(spec, vocab_size=40).warnings if "'mogrifier': hidden size as small as" in w]
    assert "mogrifier_rounds=4" in small and "below 40 (the vocabulary size: a smaller state limits the softmax's " \
        "rank)" in small
    (large,) = [w for w in plan_study(spec, vocab_size=300).warnings if "'mogrifier': hidden size as small as" in w]
    assert "below 128 the recurrent state has little room" in large


def test_corners_span_only_the_ranges_that_change_the_parameter_count():
    spec = parse_spec(shipped_space("mogrifier_ptb").text)
    shaping = shaping_names(spec, "mogrifier", 10_000)
    assert shaping == ["input_embedding_ratio", "mogrifier_rounds", "mogrifier_rank"]  # not the dropout rates
    corners = corner_points(spec, "mogrifier", shaping)
    assert len(corners) == 8
    assert {corner["mogrifier_rounds"] for corner in corners} == {0, 6}
    assert {corner["input_dropout"] for corner in corners} == {0.0}


def test_a_huge_vocabulary_warns_that_the_recurrence_holds_little():
    dataset = {"generator": "markov", "vocab_size": 5000, "order": 1}
    warnings = plan_study(spec_with(dataset=dataset, parameter_budget=800_000), vocab_size=5000).warnings
    assert any("recurrent layers hold" in warning and "parameter_budget" in warning for warning in warnings)
    sensible = plan_study(spec_with(parameter_budget=2_000_000), vocab_size=20)
    assert sensible.warnings == [] and sensible.families[0].hidden_size.min >= 128


def test_reverse_copy_needs_a_window_that_holds_an_example():
    too_short = parse_spec(with_bptt(REVERSE_COPY, 41))  # 2 * 20 + 2 = 42
    (issue,) = submission_issues(too_short)
    assert issue.field == "training.bptt" and "42" in issue.message
    assert any(w.startswith("training.bptt: got 41") and "refuse" in w
               for w in plan_study(too_short, vocab_size=12).warnings)
    few_whole = plan_study(parse_spec(with_bptt(REVERSE_COPY, 50)), vocab_size=12).warnings
    assert any("only 22% of the reverse-copy examples" in warning for warning in few_whole)  # (50 - 40 + 1) / 50
    assert not any("bptt" in w for w in plan_study(parse_spec(with_bptt(REVERSE_COPY, 80)), vocab_size=12).warnings)
    assert submission_issues(parse_spec(with_bptt(REVERSE_COPY, 42))) == []


def test_estimates_extrapolate_the_probe_with_the_schedule():
    timing = ProbeTiming(step_seconds=0.5, evaluation_seconds_per_token=0.001, cpu_per_wall=2.0)
    size = CorpusSize(vocab_size=20, train_tokens=16_001, valid_tokens=1_000, test_tokens=1_000)
    turns = estimate_trial(Schedule(turns=3, steps_per_turn=10, eval_batch_size=10), timing, size)
    assert turns.turns == 3 and turns.evaluation_seconds == pytest.approx(0.99)  # 990 scored tokens
    assert turns.trial_seconds == pytest.approx(30 * 0.5 + 3 * 0.99)
    epochs = estimate_trial(Schedule(budget_epochs=2, steps_per_turn=10, batch_size=16, bptt=10), timing, size)
    assert epochs.turns == 20  # 1000 rows per stream: 100 windows per epoch
    timed = estimate_trial(Schedule(budget_seconds=100, clock="process", steps_per_turn=10), timing, size)
    assert timed.trial_seconds == pytest.approx(50)  # two CPU seconds per wall second

    spec = spec_with()  # 3 turns of 4 steps, evaluation streams of 4 tokens
    cheap_evaluation = ProbeTiming(step_seconds=0.5, evaluation_seconds_per_token=0.0001, cpu_per_wall=1.0)
    dear_evaluation = ProbeTiming(step_seconds=0.5, evaluation_seconds_per_token=0.01, cpu_per_wall=1.0)
    planned = with_estimates(plan_study(spec, 20), spec, {"lstm": cheap_evaluation, "mogrifier": dear_evaluation},
                             size, machine=Machine(cpus=2, gpus=0), device="cpu", threads=1, probe_seconds=1.0)
    lstm, mogrifier = (family.estimate for family in planned.families)
    assert lstm.evaluation_share < 0.25 < mogrifier.evaluation_share
    assert planned.estimate.parallel_trials == 2  # concurrency 2, one core each
    assert planned.estimate.study_seconds == pytest.approx((lstm.trial_seconds + mogrifier.trial_seconds) / 2)
    (warning,) = [warning for warning in planned.warnings if "evaluation takes" in warning]
    assert warning.startswith("family 'mogrifier': evaluation takes an estimated")
    quick = ProbeTiming(step_seconds=0.0005, evaluation_seconds_per_token=0.0001, cpu_per_wall=1.0)  # 0.1 s a turn
    quiet = with_estimates(plan_study(spec, 20), spec, {"lstm": quick}, size, machine=Machine(cpus=2, gpus=0),
                           device="cpu", threads=1, probe_seconds=1.0)
    assert quiet.families[0].estimate.evaluation_share > 0.9  # of a trial of 0.3 s: no time worth saving
    assert not [warning for warning in quiet.warnings if "evaluation takes" in warning]
    one_core = with_estimates(plan_study(spec, 20), spec, {}, size, machine=Machine(cpus=1, gpus=0), device="cpu",
                              threads=1, probe_seconds=1.0)
    assert one_core.estimate.parallel_trials == 1


@pytest.mark.slow
def test_cli_plans_without_creating_anything(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(TINY_SPEC, sort_keys=False))
    probed = tuner("plan", "--space", str(space), "--json", "--seconds", "2", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr
    planned = json.loads(probed.stdout)
    assert [family["family"] for family in planned["families"]] == ["lstm", "mogrifier"]
    assert all(family["estimate"]["step_seconds"] > 0 for family in planned["families"])
    assert planned["estimate"]["threads"] == 1 and planned["estimate"]["study_seconds"] > 0
    steps = {family["family"]: family["estimate"]["step_seconds"] for family in planned["families"]}
    for family, step in steps.items():  # each family's probe said when done, on stderr (stdout is the JSON)
        assert f"  {family}: probed in " in probed.stderr and f"(a training step {step * 1000:,.1f} ms)" in \
            probed.stderr
    table = tuner("plan", "--space", "small/mogrifier_ptb", "--no-probe", cwd=tmp_path)
    assert table.returncode == 0 and "hidden size min / median / max" in table.stdout
    assert "time per trial" not in table.stdout
    assert "leaked" not in table.stderr  # torch._dynamo loaded Triton: its bindings' report at exit stays off
    assert not (tmp_path / "home").exists()  # LM_TUNER_HOME: no database, no artifacts


def test_cli_plan_of_unreadable_data_says_so_without_announcing_a_probe(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    space = tmp_path / "latin.yaml"
    space.write_text(yaml.safe_dump({**TINY_SPEC, "dataset": {"path": str(corpus), "format": "text"}}))
    refused = tuner("plan", "--space", str(space), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "not UTF-8 text" in refused.stderr


@pytest.mark.slow
def test_reverse_copy_too_short_is_planned_but_not_launched(tmp_path):
    space = tmp_path / "copy.yaml"
    space.write_text(yaml.safe_dump(with_bptt(REVERSE_COPY, 30), sort_keys=False))
    planned = tuner("plan", "--space", str(space), "--no-probe", cwd=tmp_path)
    assert planned.returncode == 0 and "training.bptt: got 30" in planned.stdout
    refused = tuner("launch", "--space", str(space), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert f"{space}: training.bptt: got 30; allowed: at least 2 * dataset.length + 2 = 42" in refused.stderr
    assert not (tmp_path / "home").exists()


@pytest.mark.slow
def test_api_plans_and_returns_warnings_with_submissions(tmp_path):
    settings = Settings(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    yaml_body = {"content-type": "application/yaml"}
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        planned = client.post("/studies/plan", content=yaml.safe_dump(TINY_SPEC), headers=yaml_body)
        assert planned.status_code == 200
        body = planned.json()
        assert [family["family"] for family in body["families"]] == ["lstm", "mogrifier"]
        assert body["families"][1]["hidden_size"]["min"] < body["families"][1]["hidden_size"]["max"]
        assert body["estimate"] is None and body["families"][0]["estimate"] is None
        assert body["cost"]["source"] == "flop count" and " core-hours: " in body["cost"]["summary"]
        assert "on the server's machine, " in body["cost"]["summary"]  # not "this machine": the client's, to a client
        probed = client.post("/studies/plan", params={"probe": "true"}, content=json.dumps(TINY_SPEC))
        assert probed.status_code == 200 and probed.json()["estimate"]["study_seconds"] > 0
        assert probed.json()["cost"]["source"] == "probe"

        short = yaml.safe_dump(with_bptt(REVERSE_COPY, 30))
        refused = client.post("/studies", content=short, headers=yaml_body)
        assert refused.status_code == 422
        assert [issue["field"] for issue in refused.json()["detail"]] == ["training.bptt"]
        warned = client.post("/studies/plan", content=short, headers=yaml_body).json()["warnings"]
        assert any(warning.startswith("training.bptt: got 30") for warning in warned)

        narrow = {**TINY_SPEC, "dataset": {**TINY_SPEC["dataset"], "vocab_size": 300}}  # hidden sizes below 128
        submitted = client.post("/studies", content=yaml.safe_dump(narrow), headers=yaml_body)
        assert submitted.status_code == 202
        assert any("hidden size as small as" in warning for warning in submitted.json()["warnings"])
        cost = submitted.json()["cost"]  # as `tuner launch` prints it
        assert cost["source"] == "flop count" and cost["summary"].startswith("at least ") and not cost["over_a_day"]
        assert "on the server's machine, " in cost["summary"]
        unreadable = {**TINY_SPEC, "dataset": {"path": str(tmp_path / "absent"), "format": "ptb"}}
        missing = client.post("/studies/plan", content=json.dumps(unreadable))
        assert missing.status_code == 422 and missing.json()["detail"][0]["field"] == "dataset"


def test_data_mostly_out_of_vocabulary_is_warned_about_by_plan_launch_and_the_api(tmp_path):
    """A min_count too high for the corpus left 2 types: nine tokens in ten of valid and test became <unk>, and
    nothing said so."""
    folder = tmp_path / "data"
    folder.mkdir()
    for split, lines in (("train", 60), ("valid", 10), ("test", 10)):
        (folder / f"{split}.txt").write_text("the cat sat on a mat\n" * lines)
    scarce = {**TINY_SPEC, "dataset": {"path": str(folder), "format": "text", "min_count": 1000}}
    plentiful = {**TINY_SPEC, "dataset": {"path": str(folder), "format": "text"}}

    warned = study_plan(parse_spec(yaml.safe_dump(scarce)), probe=False).warnings
    assert [w.split(" (")[0] for w in warned if w.startswith("dataset:")] == [
        f"dataset: 85.7% of the {split} tokens are out of the vocabulary of 2 types" for split in ("valid", "test")]
    assert not [w for w in study_plan(parse_spec(yaml.safe_dump(plentiful)), probe=False).warnings
                if w.startswith("dataset:")]
    issues, submitted = data_checks(parse_spec(yaml.safe_dump(scarce)))
    assert not issues and sum("of the valid tokens are out of the vocabulary of 2 types" in w for w in submitted) == 1
    printed: list[str] = []
    _print_warnings(parse_spec(yaml.safe_dump(scarce)), 2, SimpleNamespace(print=printed.append))  # launch's
    assert sum("of the test tokens are out of the vocabulary of 2 types" in line for line in printed) == 1
