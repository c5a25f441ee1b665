"""A study's cost before it runs (tuner/spec/cost.py): GPU-hours or core-hours and the days it takes here, from the
probe or from a FLOP count calibrated by the committed throughput benchmarks, shipped in the package as a table."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from benchmarks import cell_throughput
from benchmarks.throughput_table import TABLE, derive, render
from lm_tuner.models.flops import forward_flops_per_token, training_flops_per_token
from lm_tuner.tuner.cli.app import app as TUNER
from lm_tuner.tuner.cli.running import _print_warnings
from lm_tuner.tuner.run import probe
from lm_tuner.tuner.run.machine import cpu_kind
from lm_tuner.tuner.run.probe import study_plan
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.cost import DAY_SECONDS, counted_speed, later_stages, study_cost, with_counted_cost
from lm_tuner.tuner.spec.estimate import CorpusSize, Machine, known_corpus_size
from lm_tuner.tuner.spec.plan import plan_study
from lm_tuner.tuner.spec.shipped import shipped_space
from lm_tuner.tuner.spec.space import trial_setup
from lm_tuner.tuner.spec.throughput import measured_throughput, throughput_table
from tests.conftest import TINY_SPEC

EMERALD_RAPIDS = "6/207/2"
NO_GPU = Machine(cpus=2, gpus=0, cpu_kind=EMERALD_RAPIDS)


def test_the_packaged_table_is_what_the_committed_results_give():
    """Regenerate it with `PYTHONPATH=. python benchmarks/throughput_table.py` after committing new results."""
    assert TABLE.read_text() == render(derive())
    assert throughput_table() == derive()  # read from the package, not from benchmarks/results


@pytest.mark.parametrize("family", list(cell_throughput.FAMILY_FIELDS))
def test_a_models_flops_are_counted_as_the_benchmark_counts_them(family):
    model = cell_throughput.OurLanguageModel(family)
    per_token = cell_throughput.matmul_flops_per_token(model)
    assert forward_flops_per_token(cell_throughput.config_for(family)) == per_token
    assert training_flops_per_token(cell_throughput.config_for(family)) == 3 * per_token


def test_the_measurement_of_this_kind_is_taken_else_a_stated_default():
    mine = measured_throughput(["lstm", "awd_lstm", "gru"], device="cpu", threads=2, cpu_kind=EMERALD_RAPIDS,
                               gpu_name=None, character_level=False)
    assert mine.measured.endswith("(cell_throughput_cpu_2threads_intel_emerald_rapids.json)")
    rates = {kind["file"]: kind for kind in throughput_table()["kinds"]}
    measured = rates["cell_throughput_cpu_2threads_intel_emerald_rapids.json"]["word"]["flops_per_second"]
    assert mine.flops_per_second == {"lstm": measured["lstm"], "awd_lstm": measured["lstm"],
                                     "gru": min(measured.values())}
    assert "awd_lstm at lstm's rate (the same cell)" in mine.notes
    assert "gru was not measured: the slowest measured family's rate" in mine.notes

    unknown = measured_throughput(["lstm"], device="cpu", threads=4, cpu_kind="99/1/1", gpu_name=None,
                                  character_level=True)
    slowest = min((kind for kind in rates.values() if kind["device"] == "cpu" and kind["threads"] == 2),
                  key=lambda kind: sum(kind["word"]["flops_per_second"].values()))
    assert unknown.measured.endswith(f"character level, E = H = 512 ({slowest['file']})")
    (why,) = unknown.notes
    assert "this CPU (99/1/1) was not measured: the slowest CPU measured" in why and "the trial's 4" in why

    # another stepping of a measured model (6/207/1 where 6/207/2 was measured) is taken as that model, said so
    revision = measured_throughput(["lstm"], device="cpu", threads=2, cpu_kind="6/207/1", gpu_name=None,
                                   character_level=False)
    assert revision.measured.endswith("(cell_throughput_cpu_2threads_intel_emerald_rapids.json)")
    assert revision.notes == ("this CPU (6/207/1) was not measured: another stepping of its model, 6/207/2",)

    assert "h200" in measured_throughput(["mogrifier"], device="gpu", threads=16, cpu_kind=None,
                                         gpu_name="NVIDIA H200", character_level=False).measured
    default = measured_throughput(["mogrifier"], device="gpu", threads=4, cpu_kind=None, gpu_name=None,
                                  character_level=False)
    assert default.measured.endswith("(cell_throughput_gpu.json)")
    assert default.notes == ("this machine has no GPU: the default GPU, NVIDIA H100 80GB HBM3",)


def test_cpu_kind_reads_the_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R)\n"
                       "stepping\t: 2\n\nprocessor\t: 1\ncpu family\t: 25\n")
    assert cpu_kind(cpuinfo) == "6/207/2"
    assert cpu_kind(tmp_path / "absent") is None


def test_a_flop_count_adds_up_every_stage_of_every_family():
    spec = parse_spec({**TINY_SPEC, "reruns": {"top": 1, "seeds": 2},
                       "evaluation": {"bptt": 10, "temperature": False, "mc_samples": 3, "mc_multiplier": [0.5, 0.7]},
                       "dynamic_evaluation": {"trials": 4, "rms_batch_size": 8, "rms_windows": 2},
                       "resources": {"cpus_per_trial": 2}})
    size = known_corpus_size(spec.dataset)
    plan = plan_study(spec, size.vocab_size)
    cost = with_counted_cost(spec, plan, size, NO_GPU).cost
    assert cost.source == "flop count" and cost.unit == "core-hours" and cost.lower_bound  # hidden sizes far below 512
    assert set(cost.stages) == {"tuning", "reruns", "test protocol", "dynamic evaluation"}

    schedule = spec.training  # 3 turns of 4 steps, one trial per family and two reruns
    assert cost.training_tokens == 2 * 3 * (3 * 4 * schedule.batch_size * schedule.bptt)
    stages = later_stages(spec, size)
    both = 1200 + 1200
    assert stages["test protocol"].forward == 3 * both * (1 + 3 * 2)  # two reruns and the best tuning trial
    rms = 2 * 8 * 10
    assert stages["dynamic evaluation"].training == 4 * (rms + 1200) + rms + both * (1 + 3)

    speed = counted_speed(spec, plan, NO_GPU)
    flops = 0.0
    for family in plan.families:
        model = trial_setup(spec, family.family, family.median_point, size.vocab_size, seed=0).model
        trained = (1 + 2) * (3 * 4 * schedule.batch_size * schedule.bptt)  # a tuning trial and two reruns
        scored = (1 + 2) * 3 * (300 - 1) * 4  # 3 turns of each, 4 validation streams of 300 tokens less their first
        flops += (trained + stages["dynamic evaluation"].training) * training_flops_per_token(model) + \
            (scored + stages["test protocol"].forward) * forward_flops_per_token(model)
        assert speed.timings[family.family].cpu_per_wall == 2
    assert cost.flops == pytest.approx(flops)
    assert cost.device_hours == pytest.approx(2 * sum(cost.stages.values()) / 2)  # two cores a trial
    assert cost.device_hours == pytest.approx(sum(cost.stages.values()))
    assert cost.parallel_trials == 1 and cost.on_this_machine  # 2 cores, 2 a trial
    assert cost.wall_seconds == pytest.approx(3600 * cost.device_hours / 2)
    assert cost.summary.startswith("at least ") and "core-hours" in cost.summary
    assert "on this machine, 1 trial at a time" in cost.summary and "24 hours" not in cost.summary


def test_the_papers_study_is_costed_without_its_data_or_a_gpu(tmp_path, monkeypatch):
    """`tuner plan --space mogrifier_ptb.yaml` once failed after 2 s on the dataset download and said nothing of its
    cost; PTB's vocabulary and split sizes are pinned, so its shapes and tokens are known without the files."""
    monkeypatch.setenv("LM_TUNER_DATA", str(tmp_path / "datasets"))
    monkeypatch.setattr(probe, "this_machine", lambda: NO_GPU)
    planned = CliRunner().invoke(TUNER, ["plan", "--space", "mogrifier_ptb.yaml"], env={"COLUMNS": "400"})
    assert planned.exit_code == 0, planned.output
    (cost,) = [line for line in planned.stdout.splitlines() if line.startswith("cost: ")]
    assert cost.startswith("cost: about ") and " GPU-hours: " in cost and "more than 24 hours" in cost
    assert "(this machine has no GPU)" in cost and "a FLOP count at the speed measured on NVIDIA H100" in cost
    assert "not probed: the study asks for a GPU and this machine has none" in planned.stdout
    assert "note: dataset 'ptb' is not downloaded here" in planned.stdout and "`tuner data fetch ptb`" in \
        planned.stdout
    assert not (tmp_path / "datasets").exists()  # nothing downloaded, no empty folder

    spec = parse_spec(shipped_space("mogrifier_ptb").text)
    as_json = study_plan(spec, probe=True).cost
    trials = 300 + 5  # and 964 epochs of PTB's 929,589 training tokens in 64 streams of 70-token windows
    windows = math.ceil((929_589 // 64 - 1) / 70)
    assert as_json.training_tokens == pytest.approx(trials * 964 * windows * 64 * 70, rel=0.01)
    assert as_json.over_a_day and as_json.wall_seconds > DAY_SECONDS and not as_json.on_this_machine
    assert as_json.parallel_trials == 16  # the study's concurrency, on GPUs of the kind measured


def test_the_probe_prices_the_study_with_this_machines_speed():
    spec = parse_spec({**TINY_SPEC, "tuning": {"sampler": "random", "trials": 2, "concurrency": 2}})
    planned = study_plan(spec, probe=True, seconds=1)
    cost = planned.cost
    assert cost.source == "probe" and not cost.lower_bound and cost.notes == []
    assert cost.stages["tuning"] * 3600 == pytest.approx(
        2 * sum(family.estimate.trial_seconds for family in planned.families))
    assert cost.wall_seconds == pytest.approx(planned.estimate.study_seconds)  # tuning is all this study does
    assert cost.summary.startswith("about ") and cost.summary.endswith("(timed here by the probe)")


def test_more_than_a_day_is_said_in_the_one_line():
    spec = parse_spec({**TINY_SPEC, "training": {**TINY_SPEC["training"], "turns": 1_000_000_000}})
    size = CorpusSize(vocab_size=20, train_tokens=6000, valid_tokens=1200, test_tokens=1200)
    cost = with_counted_cost(spec, plan_study(spec, 20), size, NO_GPU).cost
    assert cost.over_a_day and ", more than 24 hours (" in cost.summary and " days " in cost.summary
    one_core = Machine(cpus=1, gpus=0, cpu_kind=EMERALD_RAPIDS)
    assert "on this machine, 1 trial at a time" in with_counted_cost(spec, plan_study(spec, 20), size,
                                                                      one_core).cost.summary
    wide = parse_spec({**TINY_SPEC, "resources": {"cpus_per_trial": 4}})
    elsewhere = study_cost(wide, plan_study(wide, 20), size, NO_GPU, counted_speed(wide, plan_study(wide, 20), NO_GPU))
    assert not elsewhere.on_this_machine and elsewhere.parallel_trials == 2
    assert "(a trial asks for 4 cores, this machine has 2)" in elsewhere.summary


def test_launch_states_the_cost_before_the_warnings():
    printed: list[str] = []
    narrow = {**TINY_SPEC, "dataset": {**TINY_SPEC["dataset"], "vocab_size": 300}}  # hidden sizes below 128: warned
    _print_warnings(parse_spec(yaml.safe_dump(narrow)), 300, SimpleNamespace(print=printed.append))
    assert printed[0].startswith("[dim]cost: at least ") and "core-hours" in printed[0]
    assert len(printed) > 1 and all(line.startswith("[yellow]warning:[/yellow] ") for line in printed[1:])


def test_the_cost_travels_as_json():
    spec = parse_spec(TINY_SPEC)
    planned = study_plan(spec, probe=False)
    assert json.loads(planned.model_dump_json())["cost"]["summary"] == planned.cost.summary
