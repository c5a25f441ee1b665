"""The shipped study spaces: found by name from anywhere, a local file first; `tuner spaces` lists, shows and copies."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from lm_tuner.tuner.cli.app import app as TUNER
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import SpecError, parse_spec
from lm_tuner.tuner.spec.shipped import UnknownSpace, resolve_space, shipped_names, shipped_space, shipped_spaces
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.studies import get_study
from tests.conftest import serve_app

SPACES = Path(__file__).parent.parent / "spaces"



def tuner(*args: str) -> Result:
    return CliRunner().invoke(TUNER, list(args), env={"COLUMNS": "200"})


def test_every_file_in_spaces_is_shipped_by_name():
    on_disk = {path.relative_to(SPACES).with_suffix("").as_posix() for path in SPACES.rglob("*.yaml")}
    assert set(shipped_names()) == on_disk
    assert {"mogrifier_ptb", "quickstart", "small/mogrifier_ptb"} <= on_disk
    names = shipped_names()
    assert names.index("rlstm_ptb") < names.index("small/lstm_ptb")  # full-size first, then the twins


@pytest.mark.parametrize("space", shipped_spaces(), ids=lambda space: space.name)
def test_every_shipped_space_parses_and_describes_itself(space):
    assert space.text == (SPACES / f"{space.name}.yaml").read_text()
    parse_spec(space.text, source=space.name)
    assert space.description == yaml.safe_load(space.text)["description"] != ""


@pytest.mark.parametrize("given", ["mogrifier_ptb", "mogrifier_ptb.yaml"])
def test_a_full_size_space_is_found_with_or_without_yaml(given, tmp_path):
    resolved = resolve_space(given, cwd=tmp_path)
    assert resolved.source == "shipped space mogrifier_ptb" and resolved.path is None
    assert resolved.shipped.text == (SPACES / "mogrifier_ptb.yaml").read_text()


@pytest.mark.parametrize("given", ["small/mogrifier_ptb", "small/mogrifier_ptb.yaml"])
def test_a_twin_is_found_with_or_without_yaml(given, tmp_path):
    resolved = resolve_space(given, cwd=tmp_path)
    assert resolved.source == "shipped space small/mogrifier_ptb"
    spec, text = resolved.read()
    assert spec.name == "small-mogrifier-ptb" and text == (SPACES / "small" / "mogrifier_ptb.yaml").read_text()


@pytest.mark.parametrize("given", ["mogrifier_ptb.yaml", "small/mogrifier_ptb.yaml"])
def test_a_local_file_named_like_a_shipped_space_wins(given, tmp_path):
    local = tmp_path / given
    local.parent.mkdir(exist_ok=True)
    local.write_text((SPACES / "quickstart.yaml").read_text().replace("name: quickstart", "name: mine"))
    resolved = resolve_space(given, cwd=tmp_path)
    assert (resolved.source, resolved.path, resolved.shipped) == (str(local), local, None)
    assert resolved.read()[0].name == "mine"
    assert resolve_space(str(local)).path == local  # absolute, whatever the working directory


def test_a_local_file_is_read_with_the_spec_readers_checks(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"\x80\x02PK\x00\x00")
    with pytest.raises(SpecError, match="not a text file"):
        resolve_space("model.pt", cwd=tmp_path).read()


def test_an_unknown_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(UnknownSpace) as raised:
        resolve_space("foo.yaml", cwd=tmp_path)
    message = str(raised.value)
    assert message.startswith("no such file or shipped space: 'foo.yaml'; shipped spaces: awd_lstm_ptb, lstm_ptb, ")
    assert all(name in message for name in shipped_names()) and "`tuner spaces`" in message


@pytest.mark.parametrize("given", ["../spaces/mogrifier_ptb", "small/../mogrifier_ptb", "/mogrifier_ptb",
                                   str(SPACES.parent / "tuner" / "cli"), "", "small"])
def test_only_shipped_names_are_looked_up(given):
    with pytest.raises(UnknownSpace, match="shipped spaces: awd_lstm_ptb, lstm_ptb"):
        shipped_space(given)


def test_a_name_that_climbs_out_is_refused(tmp_path):
    with pytest.raises(UnknownSpace, match=r"relative, without '\.\.'"):
        shipped_space("small/../mogrifier_ptb")
    with pytest.raises(UnknownSpace, match="no such file or shipped space: '../mogrifier_ptb'"):
        resolve_space("../mogrifier_ptb", cwd=tmp_path)


def test_spaces_lists_names_and_descriptions():
    listed = tuner("spaces")
    assert listed.exit_code == 0, listed.output
    for space in shipped_spaces():
        assert space.name in listed.stdout
    assert "LSTM vs Mogrifier LSTM at 60k parameters" in listed.stdout
    as_json = tuner("spaces", "--json")
    assert json.loads(as_json.stdout) == [{"name": s.name, "description": s.description} for s in shipped_spaces()]


def test_show_prints_the_document_exactly():
    shown = tuner("spaces", "show", "small/lstm_ptb.yaml")
    assert shown.exit_code == 0 and shown.stdout == (SPACES / "small" / "lstm_ptb.yaml").read_text()


@pytest.mark.parametrize("command", [("show", "foo"), ("copy", "foo"), ("show", "../spaces/quickstart")])
def test_an_unknown_name_is_one_line_with_exit_2(command):
    refused = tuner("spaces", *command)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    assert "small/mogrifier_ptb" in refused.stderr


def test_copy_writes_an_editable_copy_and_never_overwrites_unasked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = (SPACES / "small" / "mogrifier_ptb.yaml").read_text()
    copied = tuner("spaces", "copy", "small/mogrifier_ptb")
    assert copied.exit_code == 0 and "wrote small_mogrifier_ptb.yaml" in copied.stdout
    assert (tmp_path / "small_mogrifier_ptb.yaml").read_text() == shipped
    assert not (tmp_path / "mogrifier_ptb.yaml").exists()  # `--space mogrifier_ptb` here still means the full space

    (tmp_path / "small_mogrifier_ptb.yaml").write_text("edited")
    refused = tuner("spaces", "copy", "small/mogrifier_ptb")
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1 and "--force" in refused.stderr
    assert (tmp_path / "small_mogrifier_ptb.yaml").read_text() == "edited"
    assert tuner("spaces", "copy", "small/mogrifier_ptb", "--force").exit_code == 0
    assert (tmp_path / "small_mogrifier_ptb.yaml").read_text() == shipped


def test_copy_to_a_file_or_into_a_folder(tmp_path):
    assert tuner("spaces", "copy", "quickstart", str(tmp_path / "mine.yaml")).exit_code == 0
    assert (tmp_path / "mine.yaml").read_text() == (SPACES / "quickstart.yaml").read_text()
    assert tuner("spaces", "copy", "small/lstm_ptb", str(tmp_path)).exit_code == 0
    assert (tmp_path / "small_lstm_ptb.yaml").read_text() == (SPACES / "small" / "lstm_ptb.yaml").read_text()
    unwritable = tuner("spaces", "copy", "quickstart", str(tmp_path / "absent" / "mine.yaml"))
    assert unwritable.exit_code == 1 and "cannot write" in unwritable.stderr


def test_every_command_explains_itself():
    assert "CPU-sized twins" in tuner("spaces", "--help").stdout
    assert "exactly as shipped" in tuner("spaces", "show", "--help").stdout
    copy_help = tuner("spaces", "copy", "--help").stdout
    assert "editable copy" in copy_help and "--force" in copy_help


def test_the_rest_api_lists_reads_and_submits_shipped_spaces(storage_url, tmp_path):
    """GET /spaces and /spaces/NAME serve what `tuner spaces` shows; POST /spaces/NAME/studies queues the space as
    POST /studies would queue its YAML (on SQLite and PostgreSQL); unknown names are 404 with the list."""
    ensure_schema(storage_url)
    settings = Settings(storage_url, tmp_path / "artifacts")
    with serve_app(settings) as base:
        listed = httpx.get(f"{base}/spaces").json()
        assert [item["name"] for item in listed] == [space.name for space in shipped_spaces()]
        detail = httpx.get(f"{base}/spaces/small/lstm_ptb.yaml").json()
        assert detail["name"] == "small/lstm_ptb" and detail["text"] == shipped_space("small/lstm_ptb").text
        unknown = httpx.get(f"{base}/spaces/no_such_space")
        assert unknown.status_code == 404 and "small/mogrifier_ptb" in unknown.json()["detail"]
        assert httpx.get(f"{base}/spaces/..%2F..%2Fpyproject.toml").status_code in (404, 422)
        submitted = httpx.post(f"{base}/spaces/small/lstm_ptb/studies")
        assert submitted.status_code == 202, submitted.text
        name = submitted.json()["name"]
        assert httpx.post(f"{base}/spaces/small/lstm_ptb/studies").status_code == 409
        assert httpx.post(f"{base}/spaces/no_such_space/studies").status_code == 404
    study = get_study(storage_url, name)
    assert study.status == "queued" and study.spec == parse_spec(shipped_space("small/lstm_ptb").text).model_dump(
        mode="json")
