"""The request guard (api/guard.py) against a real server: Host names it answers to, writes from pages of other sites
(Origin, Referer, Sec-Fetch-Site), content types an HTML form can send, the dashboard's form token with the sign-in
cookie; protective headers on every response (api/headers.py); no secret echoed in a 422; what a submitted spec may
make the server read (api/data_access.py); and the tuning-curve band cache bounded against many confidences."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from lm_tuner.api.headers import CONTENT_SECURITY_POLICY
from lm_tuner.api.hosts import host_and_port, same_origin
from lm_tuner.tuner.analysis import curve_bands
from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app
from tests.test_progress import add_study
from tests.test_reports import TWO_FAMILIES, trial
from tests.test_tuning_curves import FIRST, SECOND

STUDY = "target"
YAML = {"Content-Type": "application/yaml"}
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x")


@pytest.fixture
def stored(tmp_path) -> Iterator[tuple[str, Settings]]:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ensure_schema(url)
    submit_study(url, parse_spec(json.dumps({**TINY_SPEC, "name": STUDY})), "document")
    yield url, Settings(url, tmp_path / "artifacts")


def status_of(url: str) -> str:
    from lm_tuner.tuner.store import Storage

    return Storage(url).study(STUDY).status


def spec(name: str, **fields: object) -> str:
    return json.dumps({**TINY_SPEC, "name": name, **fields})


def writes(base: str) -> list[tuple[str, str, str | None]]:
    """Every kind of write: (method, path, JSON or YAML body)."""
    return [("POST", f"/studies/{STUDY}/cancel", None), ("POST", f"/studies/{STUDY}/resume", None),
            ("DELETE", f"/studies/{STUDY}", None), ("POST", "/studies", spec("forged")),
            ("POST", "/studies/validate", spec("forged")), ("POST", "/studies/plan", spec("forged")),
            ("POST", f"/studies/{STUDY}/sensitivity", '{"parameter": "learning_rate"}'),
            ("POST", "/spaces/small/quickstart/studies", None)]


# Host names ---------------------------------------------------------------------------------------------------------

def test_only_loopback_names_are_answered_by_default_and_the_refusal_names_the_option(stored):
    _, settings = stored
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        port = base.rsplit(":", 1)[1]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST", "localhost."):
            assert client.get("/studies", headers={"Host": host}).status_code == 200, host
        refused = client.get("/dashboard", headers={"Host": f"rebind.attacker.example:{port}"})
        assert refused.status_code == 400
        assert "tuner serve --allowed-host rebind.attacker.example" in refused.json()["detail"]
        assert "LM_TUNER_ALLOWED_HOSTS" in refused.json()["detail"]
        for bad in ("user@127.0.0.1", "127.0.0.1:port", "[::1", "a b", "127.0.0.1/x"):
            assert client.get("/studies", headers={"Host": bad}).status_code == 400, bad
        assert client.post(f"/studies/{STUDY}/cancel", headers={"Host": "rebind.attacker.example"}).status_code == 400
        assert client.get("/health", headers={"Host": "10.1.2.3:8000"}).status_code == 200  # a kubelet's probe
    assert status_of(settings.storage_url) == "queued"


def test_allowed_hosts_are_answered_in_any_case_and_star_answers_every_name(stored):
    _, settings = stored
    with serve_app(replace(settings, allowed_hosts=("tuner.example.org", "[fd00::5]"))) as base, \
            httpx.Client(base_url=base) as client:
        for host in ("tuner.example.org", "TUNER.example.org:8443", "tuner.example.org.", "[FD00::5]:80"):
            assert client.get("/studies", headers={"Host": host}).status_code == 200, host
        assert client.get("/studies", headers={"Host": "other.example.org"}).status_code == 400
    with serve_app(replace(settings, allowed_hosts=("*",))) as base, httpx.Client(base_url=base) as client:
        assert client.get("/studies", headers={"Host": "anything.example"}).status_code == 200


def test_host_parsing_and_same_origin():
    assert host_and_port("[::1]:8000") == ("::1", 8000) and host_and_port("Example.ORG.") == ("example.org", None)
    assert host_and_port("a@b") is None and host_and_port("x:99999") is None and host_and_port("") is None
    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not same_origin("http://127.0.0.1:8001", "127.0.0.1:8000")  # another port is another origin
    assert same_origin("https://tuner.example.org", "tuner.example.org")  # TLS ended by a proxy
    assert same_origin("http://localhost/dashboard?x=1", "localhost:80")
    assert not same_origin("https://tuner.example.org:8443", "tuner.example.org")
    assert not same_origin("null", "127.0.0.1:8000") and not same_origin("file:///x", "127.0.0.1:8000")


# Writes from other sites ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9"}, {"Origin": "http://evil.example"}, {"Origin": "null"},
    {"Referer": "http://127.0.0.1:9/attack.html"}, {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "{self}"},
], ids=["other port", "other site", "opaque origin", "referer of another port", "same-site", "cross-site fetch"])
def test_a_write_from_a_page_of_another_site_is_refused_with_authentication_off(stored, headers):
    url, settings = stored
    with serve_app(settings) as base, httpx.Client(base_url=base, timeout=60) as client:
        sent = {name: value.replace("{self}", base) for name, value in headers.items()}
        for method, path, body in writes(base):
            refused = client.request(method, path, content=body, headers={**sent, **YAML} if body else sent)
            assert refused.status_code == 403, (method, path, refused.text)
            assert "only this server's own pages" in refused.json()["detail"]
        assert status_of(url) == "queued"
        assert client.get("/studies").json()["total"] == 1  # nothing was made


def test_same_origin_writes_and_clients_without_origin_go_through(stored):
    url, settings = stored
    with serve_app(settings) as base, httpx.Client(base_url=base, timeout=60) as client:
        page = {"Origin": base, "Referer": f"{base}/dashboard/studies/{STUDY}", "Sec-Fetch-Site": "same-origin"}
        assert client.post("/studies/validate", content=spec("checked"), headers={**page, **YAML}).status_code == 200
        assert client.post(f"/studies/{STUDY}/cancel", headers=page).status_code == 202
        assert client.post(f"/studies/{STUDY}/resume", headers={"Referer": f"{base}/dashboard"}).status_code == 202
        assert client.post("/studies", content=spec("scripted")).status_code == 202  # no Content-Type: YAML
        assert client.post("/studies", content=spec("as-json"),
                           headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 202


def test_form_content_types_are_refused_on_every_write_with_a_token_or_without(stored):
    url, settings = stored
    token = create_token(url, "ci")
    with serve_app(settings) as base, httpx.Client(base_url=base, timeout=60) as client:
        for authorised in ({}, {"Authorization": f"Bearer {token}"}):
            for kind in SIMPLE_TYPES:
                for method, path, body in writes(base):
                    refused = client.request(method, path, content=body or "", headers={"Content-Type": kind,
                                                                                         **authorised})
                    assert refused.status_code == 415, (kind, method, path, refused.text)
                    assert "application/json" in refused.json()["detail"]
        other = client.post("/studies", content=spec("xml"), headers={"Content-Type": "application/xml",
                                                                      "Authorization": f"Bearer {token}"})
        assert other.status_code == 415 and "application/yaml" in other.json()["detail"]
        yaml_body = client.post("/studies", content=spec("bearer"), headers={"Content-Type": "application/x-yaml",
                                                                             "Authorization": f"Bearer {token}"})
        assert yaml_body.status_code == 202  # a bearer client, as before
    assert status_of(url) == "queued"


# The dashboard's form token ----------------------------------------------------------------------------------------

def page_token(client: httpx.Client, path: str) -> str:
    return re.search(r'<meta name="csrf-token" content="([0-9a-f]{64})">', client.get(path).text).group(1)


def test_a_write_with_the_sign_in_cookie_needs_the_page_s_form_token(stored):
    url, settings = stored
    token = create_token(url, "browser")
    with serve_app(replace(settings, private_reads=True)) as base, httpx.Client(base_url=base) as client:
        client.cookies.set("lmt_token", token)
        missing = client.post(f"/studies/{STUDY}/cancel")
        assert missing.status_code == 403 and "X-CSRF-Token" in missing.json()["detail"]
        assert client.post(f"/studies/{STUDY}/cancel", headers={"X-CSRF-Token": "0" * 64}).status_code == 403
        form_token = page_token(client, f"/dashboard/studies/{STUDY}")
        assert page_token(client, "/dashboard") == form_token  # bound to the sign-in, the same on every page
        assert token not in client.get("/dashboard").text
        assert client.post(f"/studies/{STUDY}/cancel", headers={"X-CSRF-Token": form_token}).status_code == 202
        assert client.post(f"/studies/{STUDY}/resume", headers={"Authorization": f"Bearer {token}"}).status_code == 202
        other = create_token(url, "other")
        client.cookies.set("lmt_token", other)  # another sign-in: the old page's token is no longer good
        assert client.post(f"/studies/{STUDY}/cancel", headers={"X-CSRF-Token": form_token}).status_code == 403
    assert status_of(url) == "queued"


def test_sign_in_and_sign_out_forms_need_their_token(stored):
    url, settings = stored
    token = create_token(url, "browser")
    with serve_app(replace(settings, private_reads=True)) as base, httpx.Client(base_url=base) as client:
        fresh = client.post("/dashboard/sign-in", data={"token": token})  # no form cookie: a forged sign-in
        assert fresh.status_code == 403 and "lmt_form" in fresh.json()["detail"]
        page = client.get("/dashboard/sign-in")
        cookie = page.cookies["lmt_form"]
        assert "HttpOnly" in page.headers["set-cookie"] and "SameSite=Strict" in page.headers["set-cookie"]
        form_token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page.text).group(1)
        assert cookie not in page.text
        forged = client.post("/dashboard/sign-in", data={"token": token, "csrf_token": "f" * 64})
        assert forged.status_code == 403 and "lmt_token" not in client.cookies
        as_json = client.post("/dashboard/sign-in", json={"token": token, "csrf_token": form_token})
        assert as_json.status_code == 415
        signed_in = client.post("/dashboard/sign-in", data={"token": token, "csrf_token": form_token})
        assert signed_in.status_code == 303 and client.cookies["lmt_token"] == token
        assert client.post("/dashboard/sign-out", data={"csrf_token": form_token}).status_code == 403  # pre-sign-in
        session_token = page_token(client, "/dashboard")
        assert client.post("/dashboard/sign-out", data={"csrf_token": session_token}).status_code == 303


# Protective headers -------------------------------------------------------------------------------------------------

class _Inline(HTMLParser):
    """Inline scripts, event-handler attributes, style elements and style attributes of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if (tag == "script" and "src" not in names) or tag == "style":
            self.found.append(f"<{tag}>")
        self.found += [f"{tag}[{name}]" for name in names if name == "style" or name.startswith("on")]


def test_every_response_carries_the_protective_headers_and_pages_hold_nothing_inline(sqlite_url, tmp_path):
    add_study(sqlite_url, STUDY, **TWO_FAMILIES, tuning={"trials": 3, "concurrency": 2})
    trial_id = trial(sqlite_url, STUDY, FIRST, "COMPLETE", 4.0)
    trial(sqlite_url, STUDY, SECOND, "COMPLETE", 4.2)
    with serve_app(Settings(sqlite_url, tmp_path / "artifacts")) as base, httpx.Client(base_url=base) as client:
        pages = ["/dashboard", "/dashboard/studies/new", f"/dashboard/studies/{STUDY}",
                 f"/dashboard/studies/{STUDY}/comparison", f"/dashboard/studies/{STUDY}/sensitivity",
                 f"/dashboard/trials/{trial_id}", "/dashboard/sign-in", "/docs", "/redoc"]
        fragments = ["/dashboard/fragments/studies", f"/dashboard/fragments/studies/{STUDY}/facts",
                     f"/dashboard/fragments/studies/{STUDY}/trials", f"/dashboard/fragments/trials/{trial_id}",
                     f"/dashboard/fragments/studies/{STUDY}/comparison"]
        others = ["/studies", "/openapi.json", "/static/dashboard.js", "/static/dashboard.css", "/health",
                  "/studies/nothing", "/static/%00"]
        for path in pages + fragments + others:
            response = client.get(path)
            policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
            assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'", path
            assert policy["default-src"] == "'none'" and policy["base-uri"] == "'none'", path
            if not path.startswith("/redoc"):  # ReDoc's page adds its styles inline (api/docs.py says why)
                assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
            assert response.headers["x-frame-options"] == "DENY", path
            assert response.headers["x-content-type-options"] == "nosniff", path
            assert response.headers["referrer-policy"] == "same-origin", path
            if path in pages + fragments:
                assert response.status_code == 200, path
                parser = _Inline()
                parser.feed(response.text)
                assert parser.found == [], (path, parser.found)
        refused = client.get("/studies", headers={"Host": "evil.example"})  # the guard's answers too
        assert refused.headers["x-frame-options"] == "DENY"
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY


# Secrets in error bodies --------------------------------------------------------------------------------------------

def test_a_422_never_echoes_a_token_or_form_secret(stored):
    url, settings = stored
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        page = client.get("/dashboard/sign-in")
        form_token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page.text).group(1)
        pasted = "lmt_" + "s3cr3t" * 100  # an over-long paste
        answer = client.post("/dashboard/sign-in", data={"token": pasted, "csrf_token": form_token,
                                                         "next": "/dashboard" + "x" * 3000})
        assert answer.status_code == 422
        assert [e["loc"] for e in answer.json()["detail"]] == [["body", "token"], ["body", "next"]]
        assert "s3cr3t" not in answer.text and form_token not in answer.text and "xxxx" not in answer.text
        queried = client.get("/studies", params={"offset": "abc"})  # what is not secret is still echoed
        assert queried.json()["detail"][0]["input"] == "abc"


def test_secret_named_fields_and_entries_are_hidden_by_the_answer_itself():
    import asyncio

    from fastapi.exceptions import RequestValidationError
    from starlette.requests import Request

    from lm_tuner.api.params import HIDDEN, answer_validation_error

    errors = [{"type": "x", "loc": ("body", "api_key"), "msg": "m", "input": "k1"},
              {"type": "x", "loc": ("header", "x-anything"), "msg": "m", "input": "h1"},
              {"type": "x", "loc": ("cookie", "session"), "msg": "m", "input": "c1"},
              {"type": "x", "loc": ("body",), "msg": "m", "input": {"password": "p1", "name": "kept"}},
              {"type": "x", "loc": ("body", "train_tokens"), "msg": "m", "input": 5}]
    request = Request({"type": "http", "method": "POST", "path": "/", "query_string": b"",
                       "headers": [(b"content-type", b"application/json")]})
    body = json.loads(asyncio.run(answer_validation_error(request, RequestValidationError(errors))).body)["detail"]
    assert ["input" in e for e in body] == [False, False, False, True, True]
    assert body[3]["input"] == {"password": HIDDEN, "name": "kept"} and body[4]["input"] == 5


# The server's own files ---------------------------------------------------------------------------------------------

def text_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    words = " ".join(f"w{i % 17}" for i in range(400))
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text(words + "\n")
    return folder


def test_reading_the_server_s_files_needs_a_token_even_with_public_reads(stored, tmp_path):
    url, settings = stored
    token = create_token(url, "ci")
    folder = text_corpus(tmp_path / "corpus")
    with serve_app(settings) as base, httpx.Client(base_url=base, timeout=120) as client:
        answers = {}
        for label, path in (("existing", folder), ("missing", tmp_path / "nowhere"), ("a file", folder / "train.txt")):
            answer = client.post("/studies/validate", content=spec("local", dataset={"path": str(path),
                                                                                     "format": "text"}))
            answers[label] = (answer.status_code, answer.json())
        assert {code for code, _ in answers.values()} == {401}
        assert len({json.dumps(body) for _, body in answers.values()}) == 1  # the same answer: nothing learned
        assert "bearer token" in answers["missing"][1]["detail"]
        shipped = client.post("/studies/validate", content=spec("generated"))  # generated data: reads stay public
        assert shipped.status_code == 200
        authorised = client.post("/studies/validate", content=spec("local", dataset={"path": str(folder),
                                                                                     "format": "text"}),
                                 headers={"Authorization": f"Bearer {token}"})
        assert authorised.status_code == 200, authorised.text


def test_data_folders_confine_what_a_spec_may_read_and_say_the_same_for_missing_and_existing(stored, tmp_path):
    url, settings = stored
    allowed = text_corpus(tmp_path / "allowed" / "corpus").parent
    outside = text_corpus(tmp_path / "outside")
    (allowed / "escape").symlink_to(outside)
    with serve_app(replace(settings, data_folders=(allowed,))) as base, httpx.Client(base_url=base, timeout=120) as c:
        def sent(route: str, path: Path, name: str = "local") -> httpx.Response:
            return c.post(route, content=spec(name, dataset={"path": str(path), "format": "text"}))

        refusals = {}
        for label, path in (("outside", outside), ("missing outside", tmp_path / "nowhere"),
                            ("up and out", allowed / ".." / "outside"), ("link out", allowed / "escape")):
            answer = sent("/studies/validate", path)
            assert answer.status_code == 403, (label, answer.text)
            refusals[label] = answer.json()["detail"].replace(str(path), "PATH")
        assert len(set(refusals.values())) == 1
        assert "tuner serve --data-folder PATH" in refusals["outside"] and str(allowed) in refusals["outside"]
        for route in ("/studies", "/studies/plan"):
            assert sent(route, outside).status_code == 403, route
        assert sent("/studies/validate", allowed / "corpus").status_code == 200
        missing_inside = sent("/studies/validate", allowed / "nothing")
        assert missing_inside.status_code == 422 and missing_inside.json()["detail"][0]["field"] == "dataset"
        assert sent("/studies", allowed / "corpus", "inside").status_code == 202


# Caches keyed by client input ---------------------------------------------------------------------------------------

def test_many_distinct_confidences_run_few_simulations_and_keep_a_bounded_cache(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(curve_bands, "MAX_KEPT_FILES", 4)
    curve_bands.band_weights.cache_clear()
    simulations = []
    simulate = curve_bands._simulate
    monkeypatch.setattr(curve_bands, "_simulate", lambda *args: simulations.append(args) or simulate(*args))
    add_study(sqlite_url, "curves", **TWO_FAMILIES, tuning={"trials": 5, "concurrency": 2})
    for value in (4.0, 4.3, 4.1):
        trial(sqlite_url, "curves", FIRST, "COMPLETE", value)
        trial(sqlite_url, "curves", SECOND, "COMPLETE", value + 0.5)
    try:
        with serve_app(Settings(sqlite_url, tmp_path / "artifacts")) as base, httpx.Client(base_url=base) as client:
            near = [client.get("/studies/curves/tuning-curves", params={"confidence": 0.9 + i * 1e-6})
                    for i in range(100)]
            assert {r.status_code for r in near} == {200} and {r.json()["confidence"] for r in near} == {0.9}
            assert len(simulations) == 1  # one size, one confidence: one simulation
            for level in range(10):
                assert client.get("/studies/curves/tuning-curves",
                                  params={"confidence": 0.8 + level / 100}).status_code == 200
        assert len(simulations) == 11
        assert len(list(curve_bands.cache_folder().iterdir())) == 4  # the least recently used are gone
    finally:
        curve_bands.band_weights.cache_clear()
