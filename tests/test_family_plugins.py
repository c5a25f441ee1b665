"""Model families from plugins: the example plugin under tests/plugins, installed for these tests only, tuned
against the LSTM end to end; and a broken plugin, refused by name while the other families still work.

The example plugin is installed into a temporary folder that only the `tuner` processes started here see
(PYTHONPATH): installed in the project's environment, it would join every other test's registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from lm_tuner.models import ModelConfig, families, family, family_names
from lm_tuner.models.plugins import ENTRY_POINT_GROUP, FamilyPluginError
from lm_tuner.tuner.spec import SpecError, parse_spec
from tests.conftest import TINY_SPEC

EXAMPLE_PLUGIN = Path(__file__).parent / "plugins" / "lm_tuner_example_family"
SESSION_ENVIRONMENT = dict(os.environ)  # before the session's Ray fixture adds variables the CLI's Ray must not see
PLUGIN_SPEC = {**TINY_SPEC, "name": "plugin", "families": ["lstm", "lstm_layer_norm"], "fixed": {"num_layers": 1},
               "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}

DYNAMIC_EVALUATION = {"top": 1, "trials": 1, "sampler": "random", "rms_batch_size": 16, "rms_windows": 2,
                      "search_space": {"max_time_steps": {"low": 1, "high": 5},
                                       "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
                                       "decay": {"low": 1e-5, "high": 1e-2, "log": True},
                                       "epsilon": {"low": 1e-6, "high": 1e-3, "log": True}}}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """A folder holding the example plugin, installed by pip from a copy of its source (the build leaves files)."""
    source = shutil.copytree(EXAMPLE_PLUGIN, tmp_path_factory.mktemp("source") / EXAMPLE_PLUGIN.name)
    site = tmp_path_factory.mktemp("site")
    # Offline: setuptools from this environment (torch requires it), and no download of the trove classifiers.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, timeout=300,
                   env={**SESSION_ENVIRONMENT, "VALIDATE_PYPROJECT_NO_NETWORK": "1"})
    return site


def tuner(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**SESSION_ENVIRONMENT, "COLUMNS": "200", "LM_TUNER_HOME": str(cwd / "home"),
                   "PYTHONPATH": os.pathsep.join(filter(None, (str(site), SESSION_ENVIRONMENT.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=600)


def write_spec(folder: Path, **fields: object) -> Path:
    path = folder / "plugin.yaml"
    path.write_text(yaml.safe_dump({**PLUGIN_SPEC, **fields}, sort_keys=False))
    return path


@pytest.mark.slow
def test_a_plugin_family_is_planned_tuned_and_dynamically_evaluated_against_the_lstm(plugin_site, tmp_path):
    searched = {**PLUGIN_SPEC["search_space"], "layer_norm_epsilon": {"low": 1e-6, "high": 1e-3, "log": True}}
    space = write_spec(tmp_path, search_space=searched, evaluation={"bptt": 10},
                       dynamic_evaluation=DYNAMIC_EVALUATION)
    planned = tuner(plugin_site, "plan", "--space", str(space), "--no-probe", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "family lstm_layer_norm" in planned.stdout

    launched = tuner(plugin_site, "launch", "--space", str(space), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    status = json.loads(tuner(plugin_site, "status", "plugin", "--json", cwd=tmp_path).stdout)
    assert status["status"] == "complete" and status["counts"]["COMPLETE"] == 2
    finished = sorted((trial["family"], trial["stage"], trial["state"]) for trial in status["trials"])
    assert finished == [("lstm", "dyneval", "COMPLETE"), ("lstm", "tune", "COMPLETE"),
                        ("lstm_layer_norm", "dyneval", "COMPLETE"), ("lstm_layer_norm", "tune", "COMPLETE")]
    (tuned,) = [trial for trial in status["trials"] if (trial["family"], trial["stage"]) == ("lstm_layer_norm", "tune")]
    assert 1e-6 <= tuned["params"]["layer_norm_epsilon"] <= 1e-3  # the plugin's own hyperparameter, searched


def test_a_familys_own_options_are_checked_and_survive_json() -> None:
    with pytest.raises(ValueError, match=r"options: got 'layer_norm_epsilon'; allowed: a hyperparameter of family "
                                         r"'lstm' that is not a ModelConfig field \(none\)"):
        ModelConfig(vocab_size=10, hidden_size=4, options=(("layer_norm_epsilon", 1e-5),))
    config = ModelConfig(vocab_size=10, hidden_size=4, family="awd_lstm", num_layers=3, weight_drop=0.5)
    assert config.options == () and ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_plugins_own_hyperparameter_is_validated_at_its_line(plugin_site, tmp_path):
    space = write_spec(tmp_path, fixed={"num_layers": 1, "layer_norm_epsilon": 0.5})
    refused = tuner(plugin_site, "plan", "--space", str(space), "--no-probe", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    line = space.read_text().splitlines().index("  layer_norm_epsilon: 0.5") + 1
    assert f"{space}:{line}: fixed.layer_norm_epsilon" in refused.stderr
    assert "(0, 0.1]" in refused.stderr


def test_a_plugin_whose_module_is_missing_is_one_error_naming_it_and_other_studies_plan(plugin_site, tmp_path):
    broken_site = tmp_path / "site"
    (dist_info,) = plugin_site.glob("*.dist-info")
    shutil.copytree(dist_info, broken_site / dist_info.name)  # installed, but its module is gone
    space = write_spec(tmp_path)
    refused = tuner(broken_site, "plan", "--space", str(space), "--no-probe", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    line = space.read_text().splitlines().index("- lstm_layer_norm") + 1
    assert (f"{space}:{line}: families.1: Value error, family plugin 'lstm_layer_norm' (entry point "
            "'lm_tuner_example_family:LSTM_LAYER_NORM' in group 'lm_tuner.families', distribution "
            "lm-tuner-example-family) failed to load: ModuleNotFoundError") in refused.stderr

    lstm_only = write_spec(tmp_path, families=["lstm"])
    planned = tuner(broken_site, "plan", "--space", str(lstm_only), "--no-probe", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr


def test_without_the_plugin_its_family_is_unknown(tmp_path):
    assert "lstm_layer_norm" not in family_names()
    with pytest.raises(SpecError, match="families.1: Input should be 'lstm'"):
        parse_spec(yaml.safe_dump(PLUGIN_SPEC, sort_keys=False))


def broken_plugins(folder: Path) -> metadata.EntryPoints:
    """The entry points of an installed distribution, `broken-families`: one whose module does not exist and one
    that names something other than a family."""
    dist_info = folder / "broken_families-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-families\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmissing_module = no_such_module:FAMILY\n"
                                                "not_a_family = lm_tuner.models.families:BUILT_IN_FAMILIES\n")
    return metadata.PathDistribution(dist_info).entry_points.select(group=ENTRY_POINT_GROUP)


def test_a_broken_plugin_is_refused_by_name_while_the_other_families_work(monkeypatch, tmp_path):
    entry_points = broken_plugins(tmp_path)
    monkeypatch.setattr(metadata, "entry_points", lambda group: entry_points if group == ENTRY_POINT_GROUP else ())
    monkeypatch.setattr(families, "_plugin_errors", None)  # load the plugins again, these ones

    assert family_names()[0] == "lstm" and "missing_module" not in family_names()
    with pytest.raises(FamilyPluginError, match=r"family plugin 'missing_module' \(entry point 'no_such_module:FAMILY"
                                                r"' in group 'lm_tuner.families', distribution broken-families\) "
                                                r"failed to load: ModuleNotFoundError: No module named"):
        family("missing_module")
    with pytest.raises(FamilyPluginError, match=r"'not_a_family' .* failed to load: TypeError: got tuple; allowed: "
                                                r"a Family or a callable returning one"):
        ModelConfig(vocab_size=10, hidden_size=4, family="not_a_family")
    assert ModelConfig(vocab_size=10, hidden_size=4, family="lstm").cell == "lstm"

    with pytest.raises(SpecError, match=r"families.1: .*family plugin 'missing_module' .*distribution broken-families"):
        parse_spec(yaml.safe_dump({**PLUGIN_SPEC, "families": ["lstm", "missing_module"]}, sort_keys=False))
    assert parse_spec(yaml.safe_dump({**PLUGIN_SPEC, "families": ["lstm"]}, sort_keys=False)).families == ["lstm"]
