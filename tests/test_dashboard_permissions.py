"""Page actions follow permissions, in Debian's headless Chromium: on a server with tokens, a visitor who is not
signed in sees Cancel, Resume and "queue runs" disabled with the reason and a way to sign in (as the New study page
does); signed in, the buttons work as the study's status allows."""

from __future__ import annotations

import pytest

from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import serve_app
from tests.test_dashboard_browser import ARTIFACTS, browser  # noqa: F401  (the module's Chromium, as a fixture)
from tests.test_progress import add_study

pytestmark = pytest.mark.slow


def test_a_visitor_without_a_token_sees_why_the_actions_are_disabled(browser, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    add_study(url, "guarded", status="running")
    token = create_token(url, "browser")
    with serve_app(Settings(url, tmp_path / "artifacts")) as base_url:
        context = browser.new_context(base_url=base_url)
        page = context.new_page()
        page.goto("/dashboard/studies/guarded")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        for action in ("cancel", "resume"):
            assert page.locator(f"#study-actions button[data-action={action}]").is_disabled()
        reason = page.locator("#actions-reason")
        assert reason.inner_text().startswith("Cancelling and resuming need an API token on this server")
        assert reason.locator("a").get_attribute("href") == "/dashboard/sign-in?next=/dashboard/studies/guarded"
        page.screenshot(path=str(ARTIFACTS / "permissions_visitor.png"), full_page=True)

        page.goto("/dashboard/studies/guarded/sensitivity")
        assert page.locator("#request button[type=submit]").is_disabled()
        assert "Queuing runs needs an API token" in page.locator("#request-result").inner_text()

        page.goto("/dashboard/sign-in?next=/dashboard/studies/guarded")
        page.fill("input[name=token]", token)
        page.click("form.sign-in button")
        page.wait_for_url(f"{base_url}/dashboard/studies/guarded")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        assert page.locator("#study-actions button[data-action=cancel]").is_enabled()  # running: it may be cancelled
        assert page.locator("#study-actions button[data-action=resume]").is_disabled()  # and not resumed
        assert page.locator("#actions-reason").count() == 0
        page.goto("/dashboard/studies/guarded/sensitivity")
        assert page.locator("#request button[type=submit]").is_enabled()
        context.close()
