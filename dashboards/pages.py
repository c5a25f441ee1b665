"""HTML pages: templates filled with plain data (mappings and records), no database access."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly
from jinja2 import Environment, FileSystemLoader, select_autoescape

_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
)


def plotly_js_path() -> Path:
    """plotly.js as shipped inside the plotly package, so pages work without internet access."""
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def studies_page(studies: Sequence[Mapping[str, Any]], total: int) -> str:
    return _TEMPLATES.get_template("studies.html").render(studies=studies, total=total)


def study_page(study: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], total: int) -> str:
    """`trials` is one page of the study's trials (best first); `total` counts them all."""
    return _TEMPLATES.get_template("study.html").render(study=study, trials=trials, total=total)
