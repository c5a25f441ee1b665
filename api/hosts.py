"""The names this server answers to and the origin it serves from, read from a request's Host header.

A page on an attacker's domain can make a browser send requests here by pointing its own name at this machine's
address (DNS rebinding); the browser then sends `Host: attacker.example`. Only the loopback names and the names
the operator allows (`tuner serve --allowed-host NAME`, $LM_TUNER_ALLOWED_HOSTS) are answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from lm_tuner.tuner.settings import ALLOWED_HOSTS_VARIABLE

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"  # every name: for a server behind a proxy that checks the Host header itself
HOSTS_OPTION = "--allowed-host"
DEFAULT_PORTS = {"http": 80, "https": 443}


def host_and_port(authority: str) -> tuple[str, int | None] | None:
    """The lower-case name (an IPv6 address without its brackets, no trailing dot) and the port given, if any, of
    a Host header or a URL's authority; None where it is not a host[:port]."""
    if not authority or "@" in authority or any(c.isspace() or c in "/?#\\" for c in authority):
        return None
    try:
        parts = urlsplit(f"//{authority}")
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range; an unclosed bracket
        return None
    name = (parts.hostname or "").rstrip(".")
    return (name, port) if name else None


def normalised_hosts(names: Iterable[str]) -> frozenset[str]:
    """Host names as the Host header is compared with them: lower case, IPv6 addresses without brackets, no port."""
    found = set()
    for name in names:
        name = name.strip()
        if name == ANY_HOST:
            found.add(ANY_HOST)
        elif name:
            parsed = host_and_port(name)
            found.add(parsed[0] if parsed else name.lower())
    return frozenset(found)


def host_refusal(header: str | None, allowed: frozenset[str]) -> str | None:
    """Why a request with this Host header is not answered, or None."""
    if header is None:
        return f"the request has no Host header; send the name this server is reached by ({_answered(allowed)})"
    parsed = host_and_port(header)
    if parsed is None:
        return f"Host {header!r} is not a host name with an optional port"
    name = parsed[0]
    if ANY_HOST in allowed or name in LOOPBACK_HOSTS or name in allowed:
        return None
    shown = f"[{name}]" if ":" in name else name
    return (f"Host {shown!r} is not a name this server answers to ({_answered(allowed)}), which protects it from "
            f"pages on other sites that point their own name at this machine (DNS rebinding); if clients reach it "
            f"by this name, start it with `tuner serve {HOSTS_OPTION} {shown}` (the option can be repeated; or "
            f"set ${ALLOWED_HOSTS_VARIABLE}, names separated by commas)")


def same_origin(url: str, host_header: str) -> bool:
    """Whether `url` (an Origin header, or a Referer) is the origin a request with this Host header was sent to.

    The scheme is not compared: behind a proxy that ends TLS, the page is https while the request reaching this
    server is http. A Host header without a port matches the URL's default port (80 for http, 443 for https)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    host = host_and_port(host_header)
    if host is None or parts.hostname.rstrip(".") != host[0]:
        return False
    if host[1] is None:
        return port in (None, DEFAULT_PORTS[parts.scheme])
    return (port or DEFAULT_PORTS[parts.scheme]) == host[1]


def _answered(allowed: frozenset[str]) -> str:
    names = [*LOOPBACK_HOSTS, *sorted(allowed - set(LOOPBACK_HOSTS))]
    return "answered: " + ", ".join(f"[{n}]" if ":" in n else n for n in names)
