"""`tuner serve`: the REST API and the dashboard, with a worker; the only command that imports the web app."""

import ipaddress
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from lm_tuner.tuner.cli.common import Artifacts, StorageOption, console, refuse, stop_process, stopping_cleanly
from lm_tuner.tuner.cli.served_names import answered_hosts, data_folders, shown_hosts
from lm_tuner.tuner.settings import (
    ALLOWED_HOSTS_VARIABLE,
    ARTIFACTS_VARIABLE,
    DATA_FOLDERS_VARIABLE,
    STORAGE_VARIABLE,
    Settings,
)
from lm_tuner.tuner.store import Storage

TOKEN_VARIABLE = "LM_TUNER_API_TOKEN"  # the secret of `serve --initial-token`, e.g. from a deployment's secrets


WORKER_GRACE_SECONDS = 15  # `serve` waits this long for its worker to put its study back, then stops it
# `tuner worker`, in a process group of its own (a terminal's Ctrl-C reaches `serve` alone, which stops the worker
# with SIGTERM: a worker still importing would print a KeyboardInterrupt traceback), that stops when `serve` exits.
WORKER_START = ("import sys; sys.argv[0] = 'tuner'; from lm_tuner.tuner.run.processes import die_with_parent; "
                "die_with_parent({parent}); from lm_tuner.tuner.cli import main; main()")


def serve(
    storage: StorageOption = None,
    artifacts: Artifacts = None,
    host: Annotated[str, typer.Option(help="interface to listen on (beyond this machine needs authentication on, "
                                           "or --insecure)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    worker: Annotated[bool, typer.Option(
        "--worker/--no-worker", help="also start a worker that runs studies submitted over REST")] = True,
    private_reads: Annotated[bool, typer.Option(
        "--private-reads", help="reads need a token too (the dashboard then has a sign-in page)")] = False,
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="listen beyond this machine with authentication off: anyone who reaches the port can "
                           "submit, cancel and delete studies")] = False,
    initial_token: Annotated[Optional[str], typer.Option(
        "--initial-token", metavar="NAME",
        help=f"on the first start (authentication off, no token NAME yet) create token NAME and turn "
             f"authentication on; its secret is ${TOKEN_VARIABLE} if set, else printed once")] = None,
    allowed_hosts: Annotated[Optional[list[str]], typer.Option(
        "--allowed-host", metavar="NAME", envvar=ALLOWED_HOSTS_VARIABLE,
        help="a name clients reach this server by (the Host of their requests), answered besides localhost, "
             "127.0.0.1, [::1], the --host address and, with --host 0.0.0.0 or ::, this machine's name and "
             "addresses; others are refused (400), which keeps pages of other sites out (DNS rebinding); repeat it "
             "for several; '*' answers any name (behind a proxy that checks it)")] = None,
    data_folder: Annotated[Optional[list[Path]], typer.Option(
        "--data-folder", metavar="PATH", envvar=DATA_FOLDERS_VARIABLE,
        help="a folder whose files specs submitted over REST may read as their dataset (`path`); repeat it for "
             "several; without it any folder this process can read (with tokens, only requests with a valid one)")
    ] = None,
    debug: Annotated[bool, typer.Option(
        "--debug", help="log at debug level, with the traceback of a study the worker fails as expected (its data "
                        "cannot be read or downloaded, it is refused) besides its one line")] = False,
) -> None:
    """Serve the REST API (OpenAPI at /docs) and the dashboard (at /dashboard).

    SIGINT or SIGTERM stops it cleanly: no new requests, the worker puts its study back in the queue (its
    running trials marked interrupted, to run again), every child process ends; exit status 0."""
    import uvicorn

    from lm_tuner.api.app import create_app
    from lm_tuner.tuner.cli.common import options
    from lm_tuner.tuner.cli.running import DEBUG_VARIABLE
    from lm_tuner.tuner.store import TokenError

    settings = replace(Settings.from_options(storage, artifacts, private_reads=private_reads),
                       allowed_hosts=answered_hosts(host, allowed_hosts or []),
                       data_folders=data_folders(data_folder or []))
    Storage(settings.storage_url).upgrade()
    if initial_token is not None:
        given = os.environ.get(TOKEN_VARIABLE) or None  # compose passes an unset variable as empty
        try:
            created = Storage(settings.storage_url).initial_token(initial_token, given)
        except TokenError as error:
            refuse(error)
        if created is not None:
            shown = f"its secret is ${TOKEN_VARIABLE}" if given else f"shown only this once: {created}"
            console.print(f"created API token {initial_token!r} and turned authentication on; {shown}")
    if not Storage(settings.storage_url).auth_enabled():
        if private_reads:
            refuse("--private-reads: authentication is off; create a token first (`tuner token create NAME`)")
        if not _is_loopback(host) and not insecure:
            refuse(f"--host {host}: listening beyond this machine with authentication off would let anyone who "
                    f"reaches port {port} submit, cancel and delete studies; create a token (`tuner token create "
                    f"NAME`), or pass --insecure")
    listening = _listening_socket(host, port)  # before the worker starts: a port in use is one line, not a mess
    debug = debug or options["debug"]  # `tuner --debug serve` too
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=host, port=port,
                                           log_level="debug" if debug else "info", timeout_graceful_shutdown=5))
    stopped = False
    if debug:  # read by the worker, which inherits this environment
        os.environ[DEBUG_VARIABLE] = "1"
    with stopping_cleanly(), listening:
        runner = None
        try:
            if worker:
                runner = subprocess.Popen([sys.executable, "-c", WORKER_START.format(parent=os.getpid()), "worker"],
                                          env=worker_environment(settings), process_group=0)
            console.print(f"dashboard: http://{host}:{port}/dashboard   API docs: http://{host}:{port}/docs")
            console.print(f"answering requests for {shown_hosts(settings.allowed_hosts)} (others: --allowed-host "
                          f"NAME)", highlight=False)
            # uvicorn stops serving on SIGINT or SIGTERM, then raises the signal again: KeyboardInterrupt here.
            server.run(sockets=[listening])
        except KeyboardInterrupt:
            stopped = True
        finally:
            if runner is not None:
                stop_process(runner, WORKER_GRACE_SECONDS)
    if not (stopped or server.started):  # uvicorn logged why (the app's start-up failed)
        raise typer.Exit(3)


def worker_environment(settings: Settings) -> dict[str, str]:
    """The worker's environment: this one, with the database and artifact store in the variables the worker reads.
    Never its arguments: a command line is visible to every user of the machine (`ps`), and the URL may hold a
    password; a process's environment is readable by its own user only."""
    return {**os.environ, STORAGE_VARIABLE: str(settings.storage_url),
            ARTIFACTS_VARIABLE: str(settings.artifact_root)}


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for uvicorn to serve on (IPv6 where the host has a colon, as uvicorn's own),
    or a refusal naming the option."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart while old connections close
    try:
        listening.bind((host, port))
    except socket.gaierror as error:
        listening.close()
        refuse(f"--host {host}: cannot resolve it ({error.strerror})")
    except OSError as error:
        listening.close()
        refuse(f"--port {port}: cannot listen on {host}:{port} ({error.strerror}); stop what uses it or choose "
               f"another port")
    return listening


def _is_loopback(host: str) -> bool:
    """Whether every address `host` names is on this machine only (0.0.0.0 and :: are every interface)."""
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False
