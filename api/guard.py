"""The one guard every request passes before any route runs (host, origin, content type, form token); the routes
do not repeat it.

- Every request names a host this server answers to (api/hosts.py): no DNS rebinding.
- A write (any method but GET, HEAD, OPTIONS, TRACE) that a browser sends from a page of another site is refused:
  its Origin (or, without one, its Referer) must be this server, and its Sec-Fetch-Site, where sent, same-origin.
- A write may not have a content type an HTML form can send (a form, text/plain) unless it is one of the
  dashboard's forms: a page of any site can send those without asking first.
- A write carrying the dashboard's sign-in cookie carries the page's form token too (api/csrf.py): in the
  X-CSRF-Token header, or in the forms' csrf_token field. Clients sending `Authorization: Bearer` (which no page
  of another site can add without asking first) need none.

This holds with authentication off as well: the server on loopback is then open to any page a browser shows.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette import status
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lm_tuner.api.csrf import (
    FORM_COOKIE,
    FORM_COOKIE_SECONDS,
    FORM_FIELD,
    FORM_HEADER,
    NEW_SEED,
    seed_of,
    token_matches,
)
from lm_tuner.api.deps import SESSION_COOKIE
from lm_tuner.api.hosts import host_refusal, same_origin
from lm_tuner.api.sign_in import SIGN_IN, SIGN_OUT

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
FORM_PATHS = frozenset({SIGN_IN, SIGN_OUT})  # the dashboard's HTML forms; every other write is an API call
FORM_TYPE = "application/x-www-form-urlencoded"
SIMPLE_TYPES = frozenset({FORM_TYPE, "multipart/form-data", "text/plain"})  # what a form on any site can send
MAX_FORM_BYTES = 16 * 1024
ANY_HOST_PATHS = frozenset({"/health"})  # probes (a Kubernetes kubelet) ask by the pod's address
GUARDED = {
    400: {"description": "the Host header is not a name this server answers to, or the URL holds a control "
                         "character"},
    403: {"description": "a browser request from a page of another site, or one carrying the dashboard's sign-in "
                         "cookie without the page's form token (header X-CSRF-Token)"},
    415: {"description": "a content type an HTML form can send (application/x-www-form-urlencoded, "
                         "multipart/form-data, text/plain)"},
}
"""The guard's answers to a write, documented on every write operation."""


class RequestGuard:
    """ASGI middleware: the checks above, each refusal a JSON `detail` naming what to change."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if scope["path"] not in ANY_HOST_PATHS and (refusal := host_refusal(headers.get("host"),
                                                                             self.allowed_hosts)):
            await _refuse(status.HTTP_400_BAD_REQUEST, refusal, scope, receive, send)
            return
        cookies = cookie_parser(headers.get("cookie", ""))
        seed = seed_of(cookies)
        if scope["method"] not in SAFE_METHODS:
            is_form = scope["path"] in FORM_PATHS
            answer = (_cross_site(scope, headers) or _content_type(scope, headers, is_form)
                      or (None if is_form else _missing_header_token(headers, cookies)))
            if answer is None and is_form:
                answer, receive = await _form_token(receive, seed)
            if answer is not None:
                await _refuse(*answer, scope, receive, send)
                return
        if seed is None:  # a page rendered for this request may bind its forms to a new form cookie
            send = _setting_form_cookie(send, scope)
        await self.app(scope, receive, send)


Refusal = tuple[int, str]


def _cross_site(scope: Scope, headers: Headers) -> Refusal | None:
    host = headers.get("host", "")
    this_server = f"{scope['scheme']}://{host}"
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return (status.HTTP_403_FORBIDDEN,
                f"a write from a page of another site (Sec-Fetch-Site: {site}) is refused: only this server's own "
                f"pages ({this_server}) may write through a browser")
    for header in ("origin", "referer"):  # the Referer only where a browser sent no Origin
        sent = headers.get(header)
        if sent is not None:
            if same_origin(sent, host):
                return None
            shown = "an opaque origin (null)" if sent == "null" else repr(sent.split("?")[0][:200])
            name = header.title()
            return (status.HTTP_403_FORBIDDEN,
                    f"a write from a page at {shown} ({name} header) is refused: only this server's own pages "
                    f"({this_server}) may write through a browser; API clients send no {name} header")
    return None


def _content_type(scope: Scope, headers: Headers, is_form: bool) -> Refusal | None:
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    where = f"{scope['method']} {scope['path']}"
    if is_form and media != FORM_TYPE:
        return (status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                f"{where} takes the dashboard's HTML form (Content-Type {FORM_TYPE}), not "
                f"{media or 'a body without Content-Type'}")
    if not is_form and media in SIMPLE_TYPES:
        return (status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                f"Content-Type {media} is refused on {where}: a page of any site can make a browser send it, so "
                f"writes take application/json (a study spec also application/yaml), or no body; e.g. curl -H "
                f"'Content-Type: application/yaml' --data-binary @spec.yaml")
    return None


def _missing_header_token(headers: Headers, cookies: dict[str, str]) -> Refusal | None:
    if "authorization" in headers or SESSION_COOKIE not in cookies:
        return None
    if token_matches(headers.get(FORM_HEADER), cookies[SESSION_COOKIE]):
        return None
    return (status.HTTP_403_FORBIDDEN,
            f"this request carries the dashboard's sign-in cookie but not the form token of a page of this server "
            f"(header {FORM_HEADER}): reload the page and try again; API clients send `Authorization: Bearer "
            f"TOKEN` instead, which needs no form token")


async def _form_token(receive: Receive, seed: str | None) -> tuple[Refusal | None, Receive]:
    """The form's token checked against the request's seed, and a `receive` that hands the read body on."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return (status.HTTP_400_BAD_REQUEST, "the client disconnected"), receive
        body += message.get("body", b"")
        if len(body) > MAX_FORM_BYTES:
            return (status.HTTP_413_CONTENT_TOO_LARGE, f"a form may be at most {MAX_FORM_BYTES} bytes"), receive
        if not message.get("more_body", False):
            break
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=32)
    except ValueError:
        return (status.HTTP_400_BAD_REQUEST, "the form has too many fields"), receive
    given = fields.get(FORM_FIELD, [None])[0]
    if seed is None:
        refusal = (f"the form came without this server's form cookie ({FORM_COOKIE}): reload the page and send it "
                   f"again (this browser must accept cookies from this server)")
        return (status.HTTP_403_FORBIDDEN, refusal), receive
    if not token_matches(given, seed):
        refusal = (f"the form's token ({FORM_FIELD}) is missing or not the one this server gave the page: reload the "
                   f"page and send it again")
        return (status.HTTP_403_FORBIDDEN, refusal), receive
    return None, _replaying(bytes(body), receive)


def _replaying(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _setting_form_cookie(send: Send, scope: Scope) -> Send:
    """`send` that gives the page the form cookie its form tokens were bound to, where it made one (api/csrf.py)."""

    async def sending(message: Message) -> None:
        seed = scope.get("state", {}).get(NEW_SEED)
        if message["type"] == "http.response.start" and seed is not None:
            cookie = (f"{FORM_COOKIE}={seed}; Max-Age={FORM_COOKIE_SECONDS}; Path=/; HttpOnly; SameSite=Strict"
                      + ("; Secure" if scope["scheme"] == "https" else ""))
            MutableHeaders(scope=message).append("set-cookie", cookie)
        await send(message)

    return sending


async def _refuse(code: int, detail: str, scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse({"detail": detail}, code)(scope, receive, send)
