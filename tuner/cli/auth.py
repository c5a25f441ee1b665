"""`tuner token` and `tuner auth`: who may use the REST API."""

from __future__ import annotations

from typing import Annotated

import typer

from lm_tuner.tuner.cli.common import PlainTable, StorageOption, command_group, console, refuse
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store import Storage

token_app = command_group(help="Bearer tokens for the REST API. Creating one turns authentication on.",
                          no_args_is_help=True)
auth_app = command_group(help="Whether the REST API needs tokens: on from the first `tuner token create` until "
                         "`tuner auth off`.", no_args_is_help=True)


def _database(storage: str | None) -> Storage:
    database = Storage(Settings.from_options(storage, None).storage_url)
    database.upgrade()
    return database


@token_app.command("create")
def token_create(name: Annotated[str, typer.Argument(help="who or what the token is for")],
                 storage: StorageOption = None) -> None:
    """Create a token and print it (it is stored hashed: this is the only time it is shown). Authentication is
    on from now on: every write needs a valid token, until `tuner auth off`."""
    from lm_tuner.tuner.store import TokenError

    try:
        print(_database(storage).create_token(name))
    except TokenError as error:
        refuse(error)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="the token's name")], storage: StorageOption = None) -> None:
    """Revoke a token; requests carrying it are refused from now on. Authentication stays on, also when no
    active token is left (then nobody can write until a new token is created)."""
    from lm_tuner.tuner.store import TokenError

    try:
        _database(storage).revoke_token(name)
    except TokenError as error:
        refuse(error)
    console.print(f"revoked {name}")


@token_app.command("list")
def token_list(storage: StorageOption = None) -> None:
    """Tokens by name, with when they were created and revoked."""
    table = PlainTable("name", "created", "revoked")
    for token in _database(storage).list_tokens():
        table.add_row(token.name, str(token.created_at), str(token.revoked_at or "-"))
    console.print(table)


@auth_app.command("status")
def auth_status(storage: StorageOption = None) -> None:
    """Whether the API needs tokens, and how many active tokens there are."""
    database = _database(storage)
    active = sum(token.revoked_at is None for token in database.list_tokens())
    state = "on: writes need a valid token" if database.auth_enabled() else "off: anyone who reaches the API can write"
    console.print(f"authentication {state}; {active} active token(s)")


@auth_app.command("on")
def auth_on(storage: StorageOption = None) -> None:
    """Turn authentication on again (needs an active token)."""
    from lm_tuner.tuner.store import TokenError

    try:
        _database(storage).set_auth(True)
    except TokenError as error:
        refuse(error)
    console.print("authentication on")


@auth_app.command("off")
def auth_off(storage: StorageOption = None) -> None:
    """Turn authentication off: anyone who can reach the API can submit, cancel and delete studies. A server
    listening beyond this machine then refuses to start without --insecure."""
    _database(storage).set_auth(False)
    console.print("authentication off")
