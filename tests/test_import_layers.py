"""The import arrows point one way: models <- trainers <- tuner <- api/dashboards, and inside the tuner
spec <- store <- run <- analysis <- cli. Only `tuner serve` reaches the web layer. Every import of the project's own
code is namespaced (`lm_tuner.`): the folders are not importable under their own names once installed."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
FOLDERS = ("models", "trainers", "tuner", "api", "dashboards")
LAYERS = {  # what each part of the project may import from the project
    "models": {"models"},
    "trainers": {"models", "trainers"},
    "tuner.spec": {"models", "trainers", "tuner.spec", "tuner.settings"},
    "tuner.store": {"models", "trainers", "tuner.spec", "tuner.settings", "tuner.store"},
    "tuner.run": {"models", "trainers", "tuner.spec", "tuner.settings", "tuner.store", "tuner.run"},
    "tuner.analysis": {"models", "trainers", "tuner.spec", "tuner.settings", "tuner.store", "tuner.run",
                       "tuner.analysis"},
    "tuner.cli": {"models", "trainers", "tuner"},
    "tuner": {"tuner.settings"},
    "tuner.__main__": {"tuner.cli"},
    "dashboards": {"models", "trainers", "tuner", "dashboards"},
    "api": {"models", "trainers", "tuner", "dashboards", "api"},
}
# Parts of the project that use the store through its public interface only (`from lm_tuner.tuner.store import
# Storage`); tuner.run and tuner.analysis work with its tables and modules directly (tuner/store/__init__.py).
STORE_USERS = ("api", "dashboards", "tuner.cli")
WEB_DOORS = {("tuner/cli/serve.py", "api.app"),  # `tuner serve` starts the web application
             ("tuner/cli/curves.py", "dashboards.tuning_curves")}  # `tuner curves --figure` draws the page's figure


def _part(module: str) -> str:
    """The most specific entry of LAYERS that `module` (dotted, without lm_tuner.) belongs to."""
    parts = module.split(".")
    for length in range(len(parts), 0, -1):
        if ".".join(parts[:length]) in LAYERS:
            return ".".join(parts[:length])
    raise KeyError(module)


def _allowed(importer: str, imported: str) -> bool:
    return any(imported == allowed or imported.startswith(allowed + ".") for allowed in LAYERS[_part(importer)])


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (imports inside functions count too): relative
    imports resolved against the file's package, and modules named by a string constant passed to
    `importlib.import_module` (or `__import__`)."""
    return _imports_in(path.read_text(), path)


def _imports_in(source: str, path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found += [(node.lineno, module) for module in _resolved(path, node)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and _imports_by_name(node):
            found.append((node.lineno, node.args[0].value))
    return found


def _resolved(path: Path, node: ast.ImportFrom) -> list[str]:
    """The absolute modules a relative import names, as installed (lm_tuner.…); `from . import x` names the
    package's x. A relative import climbing above lm_tuner resolves to a name no rule allows."""
    package = ["lm_tuner", *path.relative_to(ROOT).parent.parts]
    if node.level > len(package):
        return [f"{'.' * node.level}{node.module or ''} (above lm_tuner)"]
    base = ".".join(package[:len(package) - node.level + 1])
    if node.module:
        return [f"{base}.{node.module}"]
    return [f"{base}.{alias.name}" for alias in node.names]


def _imports_by_name(node: ast.Call) -> bool:
    """A call of import_module (any spelling: importlib.import_module, a bare import_module) or __import__ whose
    first argument is a string constant."""
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    return (name in ("import_module", "__import__") and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _project_files() -> list[Path]:
    return sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", _project_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_imports_point_down_the_layers(path):
    importer = _module_of(path)
    wrong = []
    for line, module in _imports(path):
        if module.startswith("."):
            wrong.append(f"{line}: {module}; import lm_tuner.… absolutely")
            continue
        if module.split(".")[0] in FOLDERS:
            wrong.append(f"{line}: {module} is not namespaced; import lm_tuner.{module}")
            continue
        if not module.startswith("lm_tuner."):
            continue
        imported = module.removeprefix("lm_tuner.")
        if (str(path.relative_to(ROOT)), imported) in WEB_DOORS:
            continue
        if not _allowed(importer, imported):
            wrong.append(f"{line}: {importer} imports {imported}, a layer above it")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", [p for p in _project_files() if _module_of(p).startswith(STORE_USERS)],
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_the_store_is_used_through_its_package(path):
    from lm_tuner.tuner import store

    wrong = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "lm_tuner.tuner.store":
            wrong += [f"{node.lineno}: {alias.name} is not in lm_tuner.tuner.store.__all__"
                      for alias in node.names if alias.name not in store.__all__]
    wrong += [f"{line}: {module}: import its names from lm_tuner.tuner.store"
              for line, module in _imports(path) if module.startswith("lm_tuner.tuner.store.")]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", ["lm_tuner.tuner.store", "lm_tuner.tuner.spec", "lm_tuner.trainers"])
def test_a_lazy_package_exports_what_it_lists(package):
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{package} lists {missing} but does not define them"


def test_a_lazy_name_is_not_shadowed_by_its_module():
    """`reverse_copy_scores` is a function and the module that defines it: importing the module (which sets the
    package's attribute to it) must not turn the package's name into the module."""
    module = importlib.import_module("lm_tuner.trainers.reverse_copy_scores")
    from lm_tuner import trainers

    assert trainers.reverse_copy_scores is module.reverse_copy_scores


LIGHT_COMMANDS = [["--help"], ["list"], ["spaces"], ["spaces", "show", "small/lstm_ptb"], ["launch", "--help"],
                  ["status", "held"], ["best", "held"], ["export", "held"]]
HEAVY_MODULES = ("torch", "ray", "lm_tuner.models", "pandas")


@pytest.mark.parametrize(("commands", "loaded"), [
    # only the database or the shipped spaces: never torch, Ray or the model families (about 1.2 s of every call on
    # a 2-core machine); the packages on the way load their names when first used, and a study's unigram baseline
    # is read from the database, not from its corpus
    (LIGHT_COMMANDS, ["pandas"]),  # export's frame
    ([["list"], ["status", "held"], ["status", "held", "--json"], ["best", "held"]], []),  # single scores: no frame
    ([["compare", "held"]], ["lm_tuner.models", "torch"]),  # the spec's families; but no Ray (0.7 s)
], ids=["light", "without-frames", "compare"])
def test_the_command_line_loads_only_what_a_command_needs(tmp_path, commands, loaded):
    from lm_tuner.tuner.run.queue import submit_study
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.storage import Storage
    from tests.conftest import TINY_SPEC

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    Storage(url).upgrade()
    submit_study(url, parse_spec({**TINY_SPEC, "name": "held"}), "name: held", unigram_perplexity=19.5)
    script = ("import sys, json\nfrom typer.testing import CliRunner\nfrom lm_tuner.tuner.cli.app import app\n"
              f"codes = [CliRunner().invoke(app, args).exit_code for args in {commands!r}]\n"
              f"print(json.dumps([codes, sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)]))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "LM_TUNER_STORAGE": url}, timeout=120)
    assert result.returncode == 0, result.stderr
    codes, heavy = json.loads(result.stdout.splitlines()[-1])
    assert codes == [0] * len(commands) and heavy == loaded


def test_the_rule_catches_an_upward_arrow():
    assert not _allowed("models.cells", "trainers.training")
    assert not _allowed("tuner.store.trials", "tuner.run.trial")
    assert not _allowed("tuner.run.controller", "api.app")
    assert _allowed("api.routes", "tuner.store.studies") and _allowed("tuner.cli.reading", "tuner.analysis.comparison")


def test_relative_and_dynamic_imports_are_seen():
    queue = ROOT / "tuner" / "run" / "queue.py"
    source = ("from ...api import app\nfrom . import stages\nfrom .trial import run_trial\n"
              "import importlib\nimportlib.import_module('lm_tuner.api.app')\n"
              "def late():\n    from importlib import import_module\n    return import_module('lm_tuner.dashboards')\n"
              "from ....beyond import nothing\n")
    assert sorted(_imports_in(source, queue)) == [
        (1, "lm_tuner.api"), (2, "lm_tuner.tuner.run.stages"), (3, "lm_tuner.tuner.run.trial"), (4, "importlib"),
        (5, "lm_tuner.api.app"), (7, "importlib"), (8, "lm_tuner.dashboards"), (9, "....beyond (above lm_tuner)"),
    ]


def test_no_family_is_named_outside_the_registry():
    """What a family is lives in models.families: the tuner, the API and the dashboard ask the registry, so a new
    family (or a plugin's) needs no edit there."""
    from lm_tuner.models import family_names

    quoted = re.compile("[\"'](" + "|".join(map(re.escape, family_names())) + ")[\"']")
    named = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in ("tuner", "api", "dashboards") for path in sorted((ROOT / folder).rglob("*"))
             if path.suffix in (".py", ".js", ".html") and "__pycache__" not in path.parts
             for number, line in enumerate(path.read_text().splitlines(), 1) if quoted.search(line)]
    assert not named, "\n".join(named)
