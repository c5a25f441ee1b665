"""The import arrows point one way: models <- trainers <- tuner <- api/dashboards, and inside the tuner
spec <- store <- run <- analysis <- cli. Only `tuner serve` reaches the web layer. Every import of the project's own
code is namespaced (`lm_tuner.`): the folders are not importable under their own names once installed."""

from __future__ import annotations

import ast
import re
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
    """(line, module) of every import in the file, at any depth (imports inside functions count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


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


def test_the_rule_catches_an_upward_arrow():
    assert not _allowed("models.cells", "trainers.training")
    assert not _allowed("tuner.store.trials", "tuner.run.trial")
    assert not _allowed("tuner.run.controller", "api.app")
    assert _allowed("api.routes", "tuner.store.studies") and _allowed("tuner.cli.reading", "tuner.analysis.comparison")


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
