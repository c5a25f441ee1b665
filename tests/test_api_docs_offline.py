"""The API's documentation pages, /docs (Swagger UI) and /redoc (ReDoc), render every operation in Chromium with
the network cut off: their scripts and styles come from the package, none from a CDN, and none inline (a
Content-Security-Policy allowing only same-origin scripts, added here to every page, holds)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from lm_tuner.tuner.settings import Settings
from tests.conftest import serve_app

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "api-docs"
# ReDoc runs its search in a worker made from a blob: URL, which only the page's own scripts can make.
SAME_ORIGIN_SCRIPTS = "script-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'none'"


@dataclass
class OfflineTab:
    page: object
    blocked: list[str] = field(default_factory=list)  # requests for other hosts, aborted
    errors: list[str] = field(default_factory=list)  # script errors and console errors


@pytest.fixture(scope="module")
def base_url(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("docs")
    with serve_app(Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")) as url:
        yield url


@pytest.fixture
def tab(base_url, request) -> Iterator[OfflineTab]:
    """A tab on the server that can reach nothing else, its pages under a same-origin-scripts policy."""
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` or `apt-get install -y --no-install-recommends chromium`")
    server = urlsplit(base_url).netloc
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 1000})
        found = OfflineTab(context.new_page())

        def route(route, request) -> None:
            if urlsplit(request.url).netloc != server:
                found.blocked.append(request.url)
                route.abort("internetdisconnected")
            elif request.resource_type == "document":  # the server's own policy, else one as strict on scripts
                answer = route.fetch()
                route.fulfill(response=answer,
                              headers={"content-security-policy": SAME_ORIGIN_SCRIPTS, **answer.headers})
            else:
                route.continue_()

        context.route("**/*", route)
        found.page.on("pageerror", lambda error: found.errors.append(str(error)))
        found.page.on("console", lambda message: found.errors.append(message.text) if message.type == "error"
                      else None)
        yield found
        found.page.screenshot(path=ARTIFACTS / f"{request.node.name}.png")
        context.close()
        browser.close()


def operations(base_url: str) -> list[dict]:
    schema = httpx.get(f"{base_url}/openapi.json").json()
    return [operation for path in schema["paths"].values() for operation in path.values()]


def test_swagger_ui_renders_every_operation_offline(tab, base_url):
    expected = operations(base_url)
    tab.page.goto("/docs")
    expect(tab.page.locator(".opblock")).to_have_count(len(expected), timeout=30_000)  # no eval: the policy forbids it
    summaries = tab.page.locator(".opblock-summary-description").all_inner_texts()
    assert sorted(summaries) == sorted(operation["summary"] for operation in expected)
    assert tab.page.locator(".info .title").inner_text().startswith("lm-tuner")
    assert tab.blocked == [] and tab.errors == []


def test_redoc_renders_every_operation_offline(tab, base_url):
    expected = operations(base_url)
    tab.page.goto("/redoc")
    titles = tab.page.locator("[data-section-id*='operation/'] h2")
    expect(titles).to_have_count(len(expected), timeout=30_000)
    assert sorted(titles.all_inner_texts()) == sorted(
        operation["summary"] for operation in expected)
    assert tab.blocked == []  # Redocly's logo in the menu footer is refused by the page itself, never asked for
    assert [error for error in tab.errors if "cdn.redoc.ly/redoc/logo-mini.svg" not in error] == []


def test_the_pages_hold_no_inline_script_and_their_files_are_served(base_url):
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        page = httpx.get(f"{base_url}{path}")
        assert page.status_code == 200
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, flags=re.DOTALL)
        assert scripts and all('src="/static/' in attributes and not body.strip() for attributes, body in scripts)
        for source in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
            assert httpx.get(f"{base_url}{source}").status_code == 200, source
    assert '&#34;validatorUrl&#34;: null' in httpx.get(f"{base_url}/docs").text  # no badge from validator.swagger.io
