"""A hostile page in real Chromium (Debian's, through Playwright) against a signed-in dashboard (a token and private
reads): served from another port of 127.0.0.1 — the same site, so the SameSite=Strict sign-in cookie goes with its
requests —, it posts a form that would cancel a study, a text/plain form and a no-cors fetch whose bodies are a
study spec, and frames the study page. All are refused; the dashboard's own Cancel button still works, with no
Content-Security-Policy violation on its page."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store import Storage
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app
from tests.test_dashboard_browser import ARTIFACTS, browser  # noqa: F401  (the module's Chromium, as a fixture)

pytestmark = pytest.mark.slow

ATTACK = """<!doctype html><html><body><h1>a page of another site</h1>
<iframe name="cancel-sink"></iframe><iframe name="create-sink"></iframe>
<iframe id="framed" src="{target}/dashboard/studies/attacked"></iframe>
<form id="cancel" method="post" action="{target}/studies/attacked/cancel" target="cancel-sink"></form>
<form id="create" method="post" action="{target}/studies" enctype="text/plain" target="create-sink">
  <input type="hidden" name='{form_name}' value='"}}'></form>
<script>
  document.getElementById("cancel").submit();
  document.getElementById("create").submit();
  fetch("{target}/studies", {{method: "POST", mode: "no-cors", credentials: "include", body: {fetched}}});
</script></body></html>"""


def forged_spec(name: str) -> dict:
    return {**TINY_SPEC, "name": name}


@pytest.fixture
def attacker(tmp_path) -> Iterator[tuple[Path, str]]:
    """A plain HTTP server on another port of 127.0.0.1, serving the files of a folder."""
    folder = tmp_path / "attacker"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_port_cannot_write_through_a_signed_in_dashboard(browser, attacker, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ensure_schema(url)
    submit_study(url, parse_spec(json.dumps(forged_spec("attacked"))), "document")
    token = create_token(url, "browser")
    folder, attacker_url = attacker
    with serve_app(Settings(url, tmp_path / "artifacts", private_reads=True)) as base_url:
        # The text/plain form sends `name=value`: a name ending inside a JSON string makes the body a whole spec.
        form_name = json.dumps({**forged_spec("forged-by-form"), "description": ""})[:-2]
        (folder / "attack.html").write_text(ATTACK.format(target=base_url, form_name=form_name.replace("'", "&#39;"),
                                                          fetched=json.dumps(json.dumps(forged_spec("forged-by-fetch")))))
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        page = context.new_page()
        page.goto(f"{base_url}/dashboard/sign-in?next=/dashboard/studies/attacked")
        page.fill("input[name=token]", token)
        page.click("form.sign-in button")
        page.wait_for_url(f"{base_url}/dashboard/studies/attacked")

        answers: list[tuple[str, int]] = []
        hostile = context.new_page()
        hostile.on("response", lambda r: answers.append((r.url.removeprefix(base_url), r.status))
                   if r.url.startswith(base_url) and r.request.method == "POST" else None)
        hostile.goto(f"{attacker_url}/attack.html")
        hostile.wait_for_function("() => document.readyState === 'complete'")
        hostile.wait_for_timeout(2000)  # the form posts and the fetch are answered
        hostile.screenshot(path=_screenshot("attack"), full_page=True)
        assert sorted(answers) == [("/studies", 403), ("/studies", 403), ("/studies/attacked/cancel", 403)], answers
        framed = hostile.frame_locator("#framed")
        assert framed.locator("#study-actions").count() == 0  # the dashboard refuses to be framed
        storage = Storage(url)
        assert storage.study("attacked").status == "queued"
        assert storage.study("forged-by-form") is None and storage.study("forged-by-fetch") is None

        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.reload()
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        page.click("#study-actions button[data-action=cancel]")
        page.wait_for_selector("#facts [data-status=cancelled]")
        assert page.locator("#study-actions [role=status]").inner_text() == "cancel requested"
        assert storage.study("attacked").status == "cancelled"
        page.screenshot(path=_screenshot("own_button"), full_page=True)
        assert errors == []
        context.close()


def _screenshot(name: str) -> str:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(ARTIFACTS / f"cross_site_{name}.png")
