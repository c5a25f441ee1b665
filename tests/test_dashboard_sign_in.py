"""The dashboard of a server with private reads, in Debian's headless Chromium: a sign-in page, a token pasted
once and then carried by an HttpOnly, SameSite=Strict cookie, and a sign-out."""

from __future__ import annotations

import json

import pytest

from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app
from tests.test_dashboard_browser import ARTIFACTS, browser  # noqa: F401  (the module's Chromium, as a fixture)

pytestmark = pytest.mark.slow


def test_private_dashboard_signs_in_with_a_token_and_out_again(browser, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ensure_schema(url)
    submit_study(url, parse_spec(json.dumps({**TINY_SPEC, "name": "private-study"})), "document")
    token = create_token(url, "browser")
    with serve_app(Settings(url, tmp_path / "artifacts", private_reads=True)) as base_url:
        context = browser.new_context(base_url=base_url)
        page = context.new_page()
        page.goto("/dashboard/studies/private-study")
        assert page.url.startswith(f"{base_url}/dashboard/sign-in?next=")  # sent to sign in, not a 401 body
        assert page.locator("h1").inner_text() == "Sign in"

        page.fill("input[name=token]", "lmt_not-a-token")
        page.click("form.sign-in button")
        assert page.get_by_role("alert").inner_text() == "unknown or revoked token"

        page.fill("input[name=token]", token)
        page.click("form.sign-in button")
        page.wait_for_url(f"{base_url}/dashboard/studies/private-study")  # back where the user was going
        assert page.locator("h1").inner_text().startswith("private-study")
        (cookie,) = [c for c in context.cookies() if c["name"] == "lmt_token"]
        assert cookie["value"] == token and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie").find(token) == -1  # the page's script cannot read the token
        page.goto("/dashboard")
        page.wait_for_selector("#studies-list >> text=private-study")
        page.screenshot(path=_screenshot("signed_in"), full_page=True)

        page.click("form.session button")
        page.wait_for_url(f"{base_url}/dashboard/sign-in")
        assert not [c for c in context.cookies() if c["name"] == "lmt_token"]
        page.goto("/dashboard")
        assert page.url.startswith(f"{base_url}/dashboard/sign-in")
        context.close()


def _screenshot(name: str) -> str:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(ARTIFACTS / f"sign_in_{name}.png")
