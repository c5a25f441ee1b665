"""Malformed requests against a real server, on SQLite and PostgreSQL (issue 18): every one is answered
with a 4xx in under a second — never a 500, never a stall —, /health answers within 200 ms throughout,
and the study stored beforehand (every row of the project's tables) is unchanged afterwards.

Hostile requests join them (issue 42), each with the answer it must get: writes from pages of other sites (a
foreign Origin or Referer, Sec-Fetch-Site), foreign Host names (DNS rebinding), content types an HTML form can send,
the sign-in cookie without the page's form token, secrets that must not be echoed. A server with tokens and a data
folder gets its own: anonymous reads of its files, folders outside the allowed one (missing or not: one answer),
and a hundred distinct cache keys (confidences of the tuning curves), which must run one simulation.

The corpus is generated: each leaf of a spec with every section is replaced by what its column or
meaning cannot take (true for a number, integers beyond 32 bits or of 5,000 digits, infinities,
control characters in text, lone surrogates), keys are given twice or with NUL, and hand-written YAML
attacks (billion laughs at several sizes, recursive aliases, deep nesting, tags, huge documents) join
them; every read endpoint is asked with bad ids, offsets, limits, names, query strings and static paths.
"""

from __future__ import annotations

import copy
import http.client
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import select

from lm_tuner.api.csrf import form_token
from lm_tuner.tuner.analysis import curve_bands
from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.yaml_loader import MAX_VALUES
from lm_tuner.tuner.store.engine import engine_for
from lm_tuner.tuner.store.schema import Base
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app
from tests.test_progress import add_study
from tests.test_reports import TWO_FAMILIES, trial

SLOWEST_ANSWER = 1.0  # seconds: the issue's bound on each rejection
SLOWEST_HEALTH = 0.2  # seconds: the issue's bound on /health under attack
STORED = "stored"

FULL_SPEC: dict[str, Any] = {
    **copy.deepcopy(TINY_SPEC),
    "name": "mutated",
    "description": "a spec with every section",
    "training": {**TINY_SPEC["training"], "averaging": {"kind": "tail", "patience": 2, "latest_start": 0.8}},
    "search_space": {**TINY_SPEC["search_space"], "input_dropout": {"choices": [0.0, 0.1], "families": ["lstm"]}},
    "tuning": {**TINY_SPEC["tuning"], "seed": 3, "startup_trials": 1,
               "initial_points": [{"learning_rate": 0.005, "mogrifier_rounds": 2}]},
    "early_stopping": {"method": "median", "grace_turns": 1, "min_samples": 2},
    "reruns": {"top": 1, "seeds": 2},
    "evaluation": {"bptt": 10, "temperature": True, "mc_samples": 2, "mc_multiplier": 0.8},
    "dynamic_evaluation": {"top": 1, "trials": 2, "startup_trials": 1, "rms_windows": 4, "search_space": {
        "max_time_steps": {"low": 1, "high": 5}, "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}}},
    "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0},
}
HUGE_INTEGER = "9" * 5000  # Python refuses to convert more than 4,300 digits

STUDY_PAGES = ["/studies/{}", "/studies/{}/trials", "/studies/{}/pareto", "/studies/{}/comparison",
               "/studies/{}/history", "/studies/{}/curves", "/studies/{}/parallel", "/studies/{}/importance",
               "/studies/{}/sensitivity?parameter=learning_rate", "/dashboard/studies/{}",
               "/dashboard/fragments/studies/{}/facts", "/dashboard/fragments/studies/{}/trials",
               "/dashboard/studies/{}/comparison", "/dashboard/fragments/studies/{}/comparison",
               "/dashboard/studies/{}/sensitivity", "/dashboard/fragments/studies/{}/sensitivity?parameter=x"]
TRIAL_PAGES = ["/trials/{}", "/trials/{}/checkpoint", "/dashboard/trials/{}", "/dashboard/fragments/trials/{}"]
PAGED = {"/studies": True, f"/studies/{STORED}/trials": True, "/dashboard/fragments/studies": False,
         f"/dashboard/fragments/studies/{STORED}/trials": False}  # path: takes a limit
BAD_NAMES = ["%00", "a%00b", "x" * 300, "%C3%A9t%C3%A9", "..%2F..%2Fetc", "%F0%9F%98%80", "-dash", "a%20b", "%FF",
             "%01", "a%0Ab"]
BAD_INTEGERS = ["-1", "2147483648", str(2**63), "1" + "0" * 5000, "abc", "1.5", "1e3", "", "0x10", "NaN", "%00"]
TEXT_QUERIES = {"/studies": ["q", "family", "status"],
                f"/studies/{STORED}/trials": ["family", "state", "stage", "sort", "order"],
                f"/studies/{STORED}/sensitivity": ["parameter"], f"/studies/{STORED}/pareto": ["x"],
                f"/studies/{STORED}/parallel": ["family"], f"/studies/{STORED}/importance": ["evaluator"],
                "/dashboard/fragments/studies": ["q", "family", "status"],
                f"/dashboard/studies/{STORED}/sensitivity": ["parameter"]}
BAD_TEXT = ["%00", "a%00b", "%01", "%1B", "%7F", "%0A", "%C2%85"]
BAD_STATIC = ["%00", "..%2F..%2Fpyproject.toml", "%2e%2e/%2e%2e/pyproject.toml", "x" * 5000, "%C3%A9.js", "vendor/",
              "dashboard.js%00.png", "vendor/..%2F..%2F..%2Fpyproject.toml", "%F0%9F%98%80", "a/" * 100, "....//x"]


@dataclass(frozen=True)
class Probe:
    """One request, sent as written (its path is not normalised); `field`: a 422 must name it; `expected`: the status
    it must get; `secret`: text the answer must not hold."""

    label: str
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = None
    field: str | None = None
    chunked: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    expected: int | None = None
    secret: str | None = None


@dataclass(frozen=True)
class Answer:
    probe: Probe
    status: int
    seconds: float
    body: bytes


class Raw(str):
    """Text written into a JSON document as it is (numbers and escapes json.dumps would not write)."""


def json_text(data: Any) -> str:
    raws: list[str] = []

    def placeholder(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, dict):
            return {key: placeholder(item) for key, item in value.items()}
        if isinstance(value, list):
            return [placeholder(item) for item in value]
        return value

    text = json.dumps(placeholder(data))
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@raw{index}@@"', raw)
    return text


def leaves(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, (*path, index))
    else:
        yield path, data


def mappings(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(data, dict):
        yield path
        for key, value in data.items():
            yield from mappings(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from mappings(value, (*path, index))


def replaced(data: Any, path: tuple, value: Any) -> Any:
    copied = copy.deepcopy(data)
    target = copied
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return copied


def unstorable(value: Any, rng: random.Random) -> list[Any]:
    """What the column or the meaning of a leaf like `value` cannot take."""
    if isinstance(value, bool):
        return [2, "true", None]
    if isinstance(value, int):
        return [True, 2**31, -(2**31) - 1, Raw(HUGE_INTEGER), Raw("0x" + "f" * 2000)]
    if isinstance(value, float):
        return [True, Raw("1e999"), Raw("-.inf"), Raw(".nan"), "NaN"]
    position = rng.randrange(len(value) + 1)
    return [value[:position] + control + value[position:] for control in ("\x00", "\x1b", "\x08")] + [
        Raw('"\\ud800' + value + '"'), [value], {value: value}]


def spec_mutations(rng: random.Random) -> list[Probe]:
    probes = []
    content_types = ["application/json", "application/yaml", "application/x-yaml", None]
    for path, value in leaves(FULL_SPEC):
        for bad in unstorable(value, rng):
            located = not isinstance(bad, Raw) or bad.startswith(("1e", "-.", ".n"))  # the rest: a line only
            probes.append(Probe(f"{'.'.join(map(str, path))} = {bad!r:.40}", "POST", "/studies",
                                json_text(replaced(FULL_SPEC, path, bad)).encode(),
                                rng.choice(content_types), ".".join(map(str, path)) if located else None))
    for path in mappings(FULL_SPEC):
        where = ".".join(map(str, path))
        probes.append(Probe(f"NUL in a key of {where or 'the root'}", "POST", "/studies",
                            json_text(replaced(FULL_SPEC, (*path, "x\x00y"), 1) if path else
                                      {**FULL_SPEC, "x\x00y": 1}).encode(), "application/json",
                            ".".join([*map(str, path), "x\\u0000y"])))
        mapping = FULL_SPEC
        for part in path:
            mapping = mapping[part]
        first = next(iter(mapping))
        twice = json_text(replaced(FULL_SPEC, (*path, "@@twice@@"), mapping[first]) if path else
                          {**FULL_SPEC, "@@twice@@": mapping[first]}).replace('"@@twice@@"', json.dumps(first))
        probes.append(Probe(f"{first!r} twice in {where or 'the root'}", "POST", "/studies", twice.encode(),
                            "application/json", ".".join([*map(str, path), first])))
    return probes


def laughs_spec(levels: int, width: int = 9) -> str:
    lines = ['  - &l0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"  - &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "laughs:\n" + "\n".join(lines) + f"\ndescription: *l{levels}\n"


def handwritten_specs() -> list[Probe]:
    def spec_with(extra: str) -> bytes:
        return (json.dumps(FULL_SPEC)[:-1] + ", " + extra + "}").encode()

    spec_text = json.dumps(FULL_SPEC)
    cases: list[tuple[str, bytes, str | None]] = []
    cases += [(f"billion laughs, {n} levels", laughs_spec(n).encode(), None) for n in range(2, 11)]
    long_laughs = laughs_spec(6).replace('"lol"', '"' + "lol" * 3000 + '"')
    cases += [("billion laughs with long strings", long_laughs.encode(), None),
              ("billion laughs through merge keys",
               b"a: &a {x: 1, y: 2}\nb: &b {<<: [*a, *a], c: *a, d: *a, e: *a, f: *a}\n"
               b"c: &c {<<: *b, g: *b, h: *b, i: *b, j: *b, k: *b, l: *b}\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
               b"e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", None)]
    cases += [("recursive alias in a list", b"families: &f [lstm, *f]\n", None),
              ("recursive alias in a mapping", b"fixed: &a {num_layers: 1, again: *a}\n", None),
              ("recursive merge key", b"search_space: &s {<<: *s}\n", None),
              ("undefined alias", b"name: *nowhere\n", None)]
    cases += [(f"{depth} nested [ (YAML flow)", ("[" * depth + "]" * depth).encode(), None)
              for depth in (21, 100, 5000, 100_000)]
    cases += [(f"{depth} nested objects (JSON)", ('{"a":' * depth + "1" + "}" * depth).encode(), None)
              for depth in (21, 1000, 40_000)]
    cases += [("5,000 nested [ in fixed", spec_with('"more": ' + "[" * 5000 + "]" * 5000), None),
              ("30 nested block mappings", "".join(f"{'  ' * i}k{i}:\n" for i in range(30)).encode() + b"  " * 30
               + b"v: 1\n", None),
              ("20,000 values", ("description: [" + ", ".join(["1"] * 20_000) + "]\n").encode(), None),
              ("a long text repeated by aliases", ("a: &a '" + "x" * 200_000 + "'\nb: [" + ", ".join(["*a"] * 5000)
                                                   + "]\n").encode(), None),
              ("4,000 families", json_text({**FULL_SPEC, "families": ["lstm", "mogrifier"] * 2000}).encode(),
               "families"),
              ("2,000 choices and 600 initial points", json_text({
                  **FULL_SPEC, "search_space": {**FULL_SPEC["search_space"],
                                                "input_dropout": {"choices": [i / 10**4 for i in range(2000)]}},
                  "tuning": {"trials": 1, "initial_points": [{"input_dropout": 0.9}] * 600}}).encode(),
               "tuning.initial_points.0.input_dropout"),
              ("a 5,000-digit number", spec_with(f'"extra": {HUGE_INTEGER}'), None),
              ("a 5,000-digit hex seed", ("tuning: {trials: 1, seed: 0x" + "f" * 5000 + "}\n").encode(), None)]
    cases += [(f"tag {tag}", f"name: x\ndescription: {tag}\n".encode(), None)
              for tag in ("!!binary AAAA", "!!timestamp 2020-01-01", "!!set {a}", "!!omap [a: 1]", "!!pairs [a: 1]",
                          "!!bool maybe", "!!int abc", "!!float x", "!!python/object/apply:os.system ['true']",
                          "!!python/name:os.system", "!custom x")]
    cases += [("two documents", spec_text.encode() + b"\n---\n" + spec_text.encode(), None),
              ("empty body", b"", None), ("a scalar", b"42", None), ("a list", b"[1, 2]", None),
              ("null", b"null", None), ("only a comment", b"# nothing\n", None),
              ("lone surrogate escape", b'{"name": "\\udc00"}', None), ("NaN literal", b'{"name": NaN}', None),
              ("raw NUL byte", spec_text.encode().replace(b'"mutated"', b'"mut\x00ated"'), None),
              ("raw escape byte", spec_text.encode().replace(b'"mutated"', b'"mut\x1bated"'), None),
              ("raw DEL byte", b"name: a\x7fb\n", None), ("byte-order mark then junk", b"\xef\xbb\xbf\x01", None),
              ("two commas", spec_text[:-1].encode() + b",,}", None), ("unclosed", spec_text[:-1].encode(), None),
              ("tabs for indentation", b"name: x\ntuning:\n\ttrials: 1\n", None),
              ("a key 2,000 characters long", ("x" * 2000 + ": 1\n").encode(), None)]
    cases += [(f"invalid UTF-8 {junk!r}", spec_text.encode().replace(b"every", junk), None)
              for junk in (b"\xff\xfe", b"\xc0\x80", b"\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82")]
    cases += [("parameter_budget 10", json_text({**FULL_SPEC, "parameter_budget": 10}).encode(), "parameter_budget"),
              ("parameter_budget 30 at vocabulary 20", json_text({**FULL_SPEC, "parameter_budget": 30}).encode(),
               "parameter_budget"),
              ("parameter_budget below PTB's smallest model",
               json_text({**FULL_SPEC, "dataset": {"name": "ptb"}, "parameter_budget": 15_000}).encode(),
               "parameter_budget"),
              ("parameter_budget 5 on local files",
               json_text({**FULL_SPEC, "dataset": {"path": "/nowhere", "format": "ptb"},
                          "parameter_budget": 5}).encode(), "parameter_budget"),
              ("an unknown hyperparameter searched", json_text(replaced(FULL_SPEC, ("search_space", "momentum"),
                                                                        {"low": 0.1, "high": 0.9})).encode(),
               "search_space.momentum"),
              ("chrono_t_max a model cannot take",
               json_text({**FULL_SPEC, "fixed": {**FULL_SPEC["fixed"], "chrono_t_max": 1.5}}).encode(),
               "fixed.chrono_t_max"),
              ("a negative seed", json_text(replaced(FULL_SPEC, ("tuning", "seed"), -1)).encode(), "tuning.seed"),
              ("a corpus seed numpy refuses", json_text(replaced(FULL_SPEC, ("dataset", "seed"), -5)).encode(),
               "dataset.seed"),
              ("too many trials", json_text(replaced(FULL_SPEC, ("tuning", "trials"), 2_000_000)).encode(),
               "tuning.trials"),
              ("a float for an integer", json_text(replaced(FULL_SPEC, ("tuning", "trials"), 2.0)).encode(),
               "tuning.trials")]
    probes = [Probe(label, "POST", "/studies", body, "application/yaml", field) for label, body, field in cases]
    probes += [Probe("multipart form", "POST", "/studies", b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\n'
                     b"x\r\n--b--\r\n", "multipart/form-data; boundary=b"),
               Probe("urlencoded form", "POST", "/studies", b"name=x&families=lstm",
                     "application/x-www-form-urlencoded"),
               Probe("binary junk", "POST", "/studies", random.Random(18).randbytes(4096), "application/octet-stream"),
               Probe("HTML", "POST", "/studies", b"<html><body>name: x</body></html>", "text/html"),
               Probe("256 KiB + 1", "POST", "/studies", b" " * (256 * 1024 + 1), "application/yaml"),
               Probe("300 KB chunked", "POST", "/studies", b"#" * 300_000, "application/yaml", chunked=True),
               Probe("PUT /studies", "PUT", "/studies", b"{}", "application/json")]
    return probes


def read_probes() -> list[Probe]:
    probes = []
    for page in STUDY_PAGES:
        probes += [Probe(f"GET {page} with name {name:.20}", "GET", page.format(name)) for name in BAD_NAMES]
    for name in BAD_NAMES[:4]:
        probes += [Probe(f"cancel {name:.20}", "POST", f"/studies/{name}/cancel"),
                   Probe(f"delete {name:.20}", "DELETE", f"/studies/{name}"),
                   Probe(f"sensitivity of {name:.20}", "POST", f"/studies/{name}/sensitivity",
                         b'{"parameter": "learning_rate"}', "application/json")]
    for page in TRIAL_PAGES:
        probes += [Probe(f"GET {page} with id {value:.20}", "GET", page.format(value)) for value in BAD_INTEGERS
                   if value not in ("", "%00")] + [Probe(f"GET {page} with id 1%00", "GET", page.format("1%00"))]
    probes += [Probe(f"curves of trial {value:.20}", "GET", f"/studies/{STORED}/curves?trial_id={value}")
               for value in BAD_INTEGERS]
    for path, limited in PAGED.items():
        probes += [Probe(f"GET {path} offset={value:.20}", "GET", f"{path}?offset={value}") for value in BAD_INTEGERS]
        if limited:
            probes += [Probe(f"GET {path} limit={value:.20}", "GET", f"{path}?limit={value}")
                       for value in ("0", "-1", "1001", str(2**63), "abc", "%00")]
    for path, names in TEXT_QUERIES.items():
        probes += [Probe(f"GET {path} {name}={value}", "GET", f"{path}?{name}={value}") for name in names
                   for value in BAD_TEXT]
    probes += [Probe(f"refresh={value}", "GET", f"/dashboard/studies/{STORED}?refresh={value}")
               for value in ("nan", "inf", "-1", "1e309", "abc", "0")]
    probes += [Probe(f"static {name:.20}", "GET", f"/static/{name}") for name in BAD_STATIC]
    probes += [Probe("static with literal ..", "GET", "/static/../pyproject.toml"),
               Probe("health with NUL in its query", "GET", "/health?x=%00")]
    sensitivity = f"/studies/{STORED}/sensitivity"
    probes += [Probe(f"sensitivity body {body[:30]!r}", "POST", sensitivity, body, "application/json", field)
               for body, field in ((b'{"parameter": "a\\u0000b"}', "parameter"),
                                   (b'{"parameter": "learning_rate", "family": "\\u0000"}', "family"),
                                   (b'{"parameter": "learning_rate", "seeds": true}', "seeds"),
                                   (b'{"parameter": "learning_rate", "points": 9223372036854775808}', "points"),
                                   (b'{"parameter": "learning_rate", "seeds": ' + HUGE_INTEGER.encode() + b"}", None),
                                   (b'{"parameter": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", None),
                                   (b'{"parameter": NaN}', None), (b"[1, 2]", None), (b"{", None), (b"\xff", None))]
    probes += [Probe(f"sensitivity body of binary junk as {kind}", "POST", sensitivity, b"9\x07\xa5\xd3\xce\xf7", kind)
               for kind in (None, "application/octet-stream", "application/json")]
    probes += [Probe("sign in with NUL", "POST", "/dashboard/sign-in",
                     f"token=%00&next=%00&csrf_token={form_token(FORM_SEED)}".encode(),
                     "application/x-www-form-urlencoded", headers=(("Cookie", f"lmt_form={FORM_SEED}"),))]
    return probes


FORM_SEED = "a-form-cookie-of-this-browser"
FOREIGN = "http://127.0.0.1:1"  # a page on another port of this host
WRITES = [("POST", f"/studies/{STORED}/cancel", None), ("POST", f"/studies/{STORED}/resume", None),
          ("DELETE", f"/studies/{STORED}", None), ("POST", "/studies", json.dumps(FULL_SPEC).encode()),
          ("POST", "/studies/validate", json.dumps(FULL_SPEC).encode()),
          ("POST", "/studies/plan", json.dumps(FULL_SPEC).encode()),
          ("POST", f"/studies/{STORED}/sensitivity", b'{"parameter": "learning_rate"}'),
          ("POST", "/spaces/small/quickstart/studies", None), ("PUT", "/studies", b"{}"),
          ("POST", "/dashboard/sign-out", b"csrf_token=x"), ("POST", "/dashboard/sign-in", b"token=x&csrf_token=x")]
FORMS = ("/dashboard/sign-out", "/dashboard/sign-in")


def _kind(path: str) -> str:
    return "application/x-www-form-urlencoded" if path in FORMS else "application/json"


def hostile_probes() -> list[Probe]:
    """Requests a hostile page, a rebinding name or a forged form sends: each refused with its own status."""
    probes = []
    for method, path, body in WRITES:
        kind = _kind(path)
        for label, headers in (("a foreign Origin", (("Origin", FOREIGN),)),
                               ("an opaque Origin", (("Origin", "null"),)),
                               ("a foreign Origin beside this host's Referer", (("Origin", "http://evil.example"),
                                                                                ("Referer", "http://127.0.0.1/"))),
                               ("a foreign Referer", (("Referer", f"{FOREIGN}/attack.html?x=1"),)),
                               ("Sec-Fetch-Site cross-site", (("Sec-Fetch-Site", "cross-site"),)),
                               ("Sec-Fetch-Site same-site", (("Sec-Fetch-Site", "same-site"),))):
            probes.append(Probe(f"{method} {path} with {label}", method, path, body, kind, headers=headers,
                                expected=403))
        for host in ("rebind.attacker.example", "rebind.attacker.example:8000", "127.0.0.1@evil.example",
                     "127.0.0.1:notaport", "[::1", "", "localhost:99999"):
            probes.append(Probe(f"{method} {path} for Host {host!r}", method, path, body, kind,
                                headers=(("Host", host),), expected=400))
        if path not in FORMS:
            for simple in ("text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                           "multipart/form-data; boundary=x", "TEXT/PLAIN"):
                probes.append(Probe(f"{method} {path} as {simple}", method, path, body or b"", simple, expected=415))
            for label, headers in (("without the form token", ()), ("with a wrong form token",
                                                                     (("X-CSRF-Token", "0" * 64),)),
                                   ("with another cookie's form token", (("X-CSRF-Token", form_token("other")),))):
                probes.append(Probe(f"{method} {path} with the sign-in cookie {label}", method, path, body, kind,
                                    headers=(("Cookie", "lmt_token=lmt_a-signed-in-browser"), *headers),
                                    expected=403))
    for path in FORMS:
        for label, headers, body in (
                ("without the form cookie", (), b"token=x&csrf_token=" + form_token(FORM_SEED).encode()),
                ("without the form token", (("Cookie", f"lmt_form={FORM_SEED}"),), b"token=x"),
                ("with another cookie's token", (("Cookie", "lmt_form=planted"),),
                 b"token=x&csrf_token=" + form_token(FORM_SEED).encode())):
            probes.append(Probe(f"{path} {label}", "POST", path, body, "application/x-www-form-urlencoded",
                                headers=headers, expected=403))
        probes.append(Probe(f"{path} as JSON", "POST", path, b"{}", "application/json", expected=415))
        probes.append(Probe(f"{path}: a form of 20 KB", "POST", path, b"x=" + b"y" * 20_000,
                            "application/x-www-form-urlencoded", headers=(("Cookie", f"lmt_form={FORM_SEED}"),),
                            expected=413))
    for method, path in (("GET", "/dashboard"), ("GET", "/studies"), ("GET", f"/studies/{STORED}"),
                         ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/static/dashboard.js")):
        probes.append(Probe(f"{method} {path} for a rebinding Host", method, path,
                            headers=(("Host", "rebind.attacker.example"),), expected=400))
    secret = "lmt_" + "pasted-secret-" * 60
    sign_in = (("Cookie", f"lmt_form={FORM_SEED}"),)
    probes += [Probe("an over-long token pasted into the sign-in form", "POST", "/dashboard/sign-in",
                     f"token={secret}&csrf_token={form_token(FORM_SEED)}".encode(),
                     "application/x-www-form-urlencoded", headers=sign_in, expected=422, secret="pasted-secret"),
               Probe("an over-long token and next", "POST", "/dashboard/sign-in",
                     f"token={secret}&next=/{'n' * 3000}&csrf_token={form_token(FORM_SEED)}".encode(),
                     "application/x-www-form-urlencoded", headers=sign_in, expected=422, secret="pasted-secret"),
               Probe("a token in a multipart sign-in", "POST", "/dashboard/sign-in",
                     b'--b\r\nContent-Disposition: form-data; name="token"\r\n\r\n' + secret.encode()
                     + b"\r\n--b--\r\n", "multipart/form-data; boundary=b", headers=sign_in, expected=415,
                     secret="pasted-secret")]
    return probes


def corpus() -> list[Probe]:
    return spec_mutations(random.Random(18)) + handwritten_specs() + read_probes() + hostile_probes()


def send(base_url: str, probe: Probe) -> Answer:
    address = urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    headers = {"Content-Type": probe.content_type} if probe.content_type else {}
    headers.update(probe.headers)
    body: Any = probe.body
    if probe.chunked:
        body = (probe.body[start:start + 65536] for start in range(0, len(probe.body), 65536))
    started = time.perf_counter()
    try:
        connection.request(probe.method, probe.path, body=body, headers=headers, encode_chunked=probe.chunked)
        response = connection.getresponse()
        content = response.read()
        return Answer(probe, response.status, time.perf_counter() - started, content)
    finally:
        connection.close()


class HealthPoller(threading.Thread):
    """GET /health every 10 ms from its own thread until stopped; keeps every latency."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            while not self.stopped.is_set():
                started = time.perf_counter()
                response = client.get("/health")
                self.latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code}: {response.text[:200]}")
                self.stopped.wait(0.01)


def table_rows(url: str) -> dict[str, list[str]]:
    """Every row of the project's tables, as text, in a stable order."""
    with engine_for(url).connect() as connection:
        return {table.name: sorted(repr(tuple(row)) for row in connection.execute(select(table)))
                for table in Base.metadata.sorted_tables}


@pytest.fixture
def served(storage_url, tmp_path) -> Iterator[tuple[str, str]]:
    settings = Settings(storage_url, tmp_path / "artifacts")
    document = json.dumps({**TINY_SPEC, "name": STORED})
    with serve_app(settings) as base_url:
        submit_study(storage_url, parse_spec(document), document)
        yield base_url, storage_url


@pytest.mark.serial
def test_malformed_requests_get_a_4xx_in_under_a_second_while_health_answers(served):
    base_url, url = served
    probes = corpus()
    assert len(probes) >= 200 and probes == corpus()  # seeded: the same corpus every run
    before = table_rows(url)
    for warm_up in (f"/studies/{STORED}", "/studies", "/health"):  # connection pools, first imports
        send(base_url, Probe("warm-up", "GET", warm_up))
    poller = HealthPoller(base_url)
    poller.start()
    try:
        answers = [send(base_url, probe) for probe in probes]
    finally:
        poller.stopped.set()
        poller.join(timeout=30)
    slowest = max(answers, key=lambda a: a.seconds)
    print(f"\n{url.split(':')[0]}: {len(answers)} malformed requests, "
          f"{sum(a.status >= 500 for a in answers)} answered >= 500, slowest {slowest.seconds * 1000:.1f} ms "
          f"({slowest.probe.label}); /health polled {len(poller.latencies)} times, worst "
          f"{max(poller.latencies) * 1000:.1f} ms")
    errors = [f"{a.status} {a.probe.label}: {a.body[:300]!r}" for a in answers if not 400 <= a.status < 500]
    assert not errors, "\n".join(errors)
    assert_as_expected(answers)
    slow = [f"{a.seconds:.3f} s {a.probe.label}" for a in answers if a.seconds >= SLOWEST_ANSWER]
    assert not slow, "\n".join(slow)
    unnamed = [f"{a.probe.label}: {a.body[:300]!r}" for a in answers
               if a.probe.field is not None and not names_field(a, a.probe.field)]
    assert not unnamed, "\n".join(unnamed)
    assert not poller.failures and len(poller.latencies) > 10
    assert max(poller.latencies) < SLOWEST_HEALTH, sorted(poller.latencies)[-5:]
    assert table_rows(url) == before


def names_field(answer: Answer, field: str) -> bool:
    """A 422 whose problems include `field` (a spec issue's field, or the end of a FastAPI error's loc)."""
    if answer.status != 422:
        return False
    parts = field.split(".")
    for issue in json.loads(answer.body)["detail"]:
        named = issue["field"].split(".") if "field" in issue else [str(part) for part in issue["loc"]]
        if parts[0] in named and named[-1] == parts[-1]:
            return True
    return False


def test_each_refusal_says_what_is_wrong_and_a_good_spec_still_goes_through(served):
    base_url, url = served
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert client.get("/static/%00").json() == {
            "detail": "the URL's path holds the control character U+0000; allowed: printable characters"}
        assert client.get("/studies", params={"family": "lstm\x00"}).status_code == 400
        assert client.get("/studies", params={"offset": 2**63}).json()["detail"][0]["loc"] == ["query", "offset"]
        assert client.get(f"/dashboard/trials/{2**63}").status_code == 422
        assert client.get(f"/studies/{'x' * 65}").json()["detail"][0]["loc"] == ["path", "name"]
        assert client.get("/static/%2e%2e/%2e%2e/pyproject.toml").status_code == 404
        laughs = client.post("/studies", content=laughs_spec(9), headers={"content-type": "application/yaml"})
        assert laughs.status_code == 422 and f"more than {MAX_VALUES:,} values" in laughs.json()["detail"][0]["message"]
        small = client.post("/studies", content=json.dumps({**TINY_SPEC, "name": "small", "parameter_budget": 30}))
        (issue, _) = small.json()["detail"]
        assert issue["field"] == "parameter_budget" and "the smallest model has 52 parameters" in issue["message"]
        good = {**TINY_SPEC, "name": "good", "description": "\U0001f600 lr 1e-05",
                "search_space": {**TINY_SPEC["search_space"], "learning_rate": {"low": 1e-05, "high": 1e-2}}}
        accepted = client.post("/studies", content=json.dumps(good), headers={"content-type": "application/json"})
        assert accepted.status_code == 202, accepted.text
        stored = client.get("/studies/good").json()["spec"]
        assert stored["description"] == good["description"] and stored["search_space"]["learning_rate"]["low"] == 1e-05


def assert_as_expected(answers: list[Answer]) -> None:
    """Each probe with an `expected` status got it, and no answer holds its probe's secret."""
    wrong = [f"{a.status} (not {a.probe.expected}) {a.probe.label}: {a.body[:300]!r}" for a in answers
             if a.probe.expected is not None and a.status != a.probe.expected]
    assert not wrong, "\n".join(wrong)
    echoed = [a.probe.label for a in answers if a.probe.secret and a.probe.secret.encode() in a.body]
    assert not echoed, echoed


def local_spec(name: str, folder: Any) -> bytes:
    return json.dumps({**FULL_SPEC, "name": name, "dataset": {"path": str(folder), "format": "text"}}).encode()


def test_a_server_with_tokens_reads_its_files_for_token_holders_in_its_folders_only(storage_url, tmp_path,
                                                                                   monkeypatch):
    allowed, outside = tmp_path / "data", tmp_path / "elsewhere"
    for folder in (allowed / "corpus", outside):
        folder.mkdir(parents=True)
        for split in ("train", "valid", "test"):
            (folder / f"{split}.txt").write_text(" ".join(f"w{i % 13}" for i in range(300)) + "\n")
    (allowed / "escape").symlink_to(outside)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    curve_bands.band_weights.cache_clear()
    simulations = []
    simulate = curve_bands._simulate
    monkeypatch.setattr(curve_bands, "_simulate", lambda *args: simulations.append(args) or simulate(*args))
    add_study(storage_url, STORED, **TWO_FAMILIES, tuning={"trials": 4, "concurrency": 2})
    for value in (4.0, 4.3, 4.1):
        for family, offset in zip(TWO_FAMILIES["families"], (0.0, 0.4), strict=True):
            trial(storage_url, STORED, family, "COMPLETE", value + offset)
    token = create_token(storage_url, "robustness")
    bearer = (("Authorization", f"Bearer {token}"),)
    probes = []
    for route in ("/studies/validate", "/studies/plan", "/studies"):
        for label, folder in (("an allowed folder", allowed / "corpus"), ("a missing folder", tmp_path / "none"),
                              ("a folder outside", outside), ("a file", allowed / "corpus" / "train.txt")):
            probes.append(Probe(f"anonymous {route} reading {label}", "POST", route, local_spec("local", folder),
                                "application/json", expected=401))
        for label, folder in (("a folder outside", outside), ("a missing folder outside", tmp_path / "none"),
                              ("/etc", "/etc"), ("a way out through ..", allowed / ".." / "elsewhere"),
                              ("a link out", allowed / "escape"), ("the home folder", "~")):
            probes.append(Probe(f"{route} with a token reading {label}", "POST", route, local_spec("local", folder),
                                "application/json", headers=bearer, expected=403))
    confidences = [f"0.9{i:06d}" for i in range(100)]  # 100 distinct values, one confidence to 3 decimals
    probes += [Probe(f"tuning curves at confidence {c}", "GET", f"/studies/{STORED}/tuning-curves?confidence={c}",
                     expected=200) for c in confidences]
    settings = Settings(storage_url, tmp_path / "artifacts", data_folders=(allowed,))
    try:
        with serve_app(settings) as base_url:
            before = table_rows(storage_url)
            answers = [send(base_url, probe) for probe in probes]
            after = table_rows(storage_url)
    finally:
        curve_bands.band_weights.cache_clear()
    print(f"\n{storage_url.split(':')[0]}: {len(answers)} requests to a server with tokens, "
          f"{sum(a.status >= 500 for a in answers)} answered >= 500, {len(simulations)} band simulations")
    assert not [a.probe.label for a in answers if a.status >= 500]
    assert_as_expected(answers)
    refusals = {re.sub(rb"dataset.path: '[^']*'", b"dataset.path: PATH", a.body)
                for a in answers if a.status == 403 and a.probe.path == "/studies/validate"}
    assert len(refusals) == 1, refusals  # missing or not, inside a link or not: one answer, nothing learned
    assert len(simulations) == 1  # both families have 3 trials; one confidence to 3 decimals: one simulation
    assert len(list(curve_bands.cache_folder().iterdir())) <= curve_bands.MAX_KEPT_FILES
    assert after == before
