"""HTML pages and fragments: templates filled with plain data (mappings and records), no database access."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

STATIC = Path(__file__).parent / "static"
_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,  # a missing value is a bug, not an empty cell
)


# plotly.js's basic bundle, vendored (static/vendor/README.md): served from here, so pages work offline.
PLOTLY_JS = "vendor/plotly-basic-4.1.1.min.js"
_TEMPLATES.globals["plotly_js_url"] = f"/static/{PLOTLY_JS}"
# Swagger UI and ReDoc, the API's documentation pages (api/docs.py), vendored likewise.
API_DOCS_FILES = {"swagger_ui_js": "vendor/swagger-ui-5.35.0-bundle.js",
                  "swagger_ui_css": "vendor/swagger-ui-5.35.0.css",
                  "swagger_ui_oauth2_redirect_js": "vendor/swagger-ui-5.35.0-oauth2-redirect.js",
                  "redoc_js": "vendor/redoc-2.5.4.standalone.js"}
_TEMPLATES.globals["vendor"] = API_DOCS_FILES


def static_path(name: str) -> Path | None:
    """A file of the dashboard's own static folder, or None (also for names leaving it)."""
    path = (STATIC / name).resolve()
    return path if path.is_file() and path.is_relative_to(STATIC.resolve()) else None


def render(template: str, **context: Any) -> str:
    """A page (`study.html`) or a fragment of one (`_trials.html`), refreshed in place by dashboard.js."""
    return _TEMPLATES.get_template(template).render(**context)
