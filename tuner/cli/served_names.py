"""What `tuner serve` answers to and reads: the host names of its requests (--allowed-host, --host) and the folders a
submitted spec may read data from (--data-folder)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from lm_tuner.tuner.cli.common import refuse

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")  # always answered (api/hosts.py)
EVERY_INTERFACE = ("0.0.0.0", "::")


def answered_hosts(host: str, given: list[str]) -> tuple[str, ...]:
    """The names answered beyond the loopback ones: those given (a value may hold several, separated by commas), and
    the address served on (--host); on every interface, this machine's name and its addresses, which another
    machine reaches it by and no other site can take over."""
    names = [name.strip() for value in given for name in value.split(",") if name.strip()]
    if host in EVERY_INTERFACE:
        names += _own_names()
    elif not _is_loopback_address(host):
        names.append(host)
    return tuple(dict.fromkeys(names))


def shown_hosts(answered: tuple[str, ...]) -> str:
    """The names a request may carry, for the start-up line."""
    if "*" in answered:
        return "any Host name (--allowed-host '*')"
    extra = [f"[{name}]" if ":" in name and not name.startswith("[") else name for name in answered]
    return ", ".join(dict.fromkeys([*LOOPBACK_NAMES, *extra]))


def data_folders(given: list[Path]) -> tuple[Path, ...]:
    """The folders given, absolute, each an existing folder (else exit 2 naming it)."""
    folders = []
    for folder in given:
        absolute = Path(os.path.normpath(folder.expanduser().absolute()))
        if not absolute.is_dir():
            refuse(f"--data-folder {folder}: no such folder")
        folders.append(absolute)
    return tuple(dict.fromkeys(folders))


def _own_names() -> list[str]:
    try:
        name = socket.gethostname()
        addresses = [info[4][0].split("%")[0] for info in socket.getaddrinfo(name, None)]
    except OSError:
        return []
    return [name, *addresses]


def _is_loopback_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"
