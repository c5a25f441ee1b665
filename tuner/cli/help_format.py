"""Help as click writes it where Typer 0.29 departs from it: a flag takes no value, so no type is shown beside it
(Typer writes `<bool>`), and a required argument reads NAME in the usage line (Typer writes `{name}`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


class ConventionalCommand(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _untyped_flags(self.params)
        for param in self.params:  # NAME in the usage line, the arguments panel and errors alike, as click names it
            if isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = param.name.upper()

    def get_help_option(self, ctx: typer.Context) -> Any:
        return _untyped_flag(super().get_help_option(ctx))

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces.extend([_usage(param)] if isinstance(param, TyperArgument) else param.get_usage_pieces(ctx))
        return pieces


class ConventionalGroup(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _untyped_flags(self.params)

    def get_help_option(self, ctx: typer.Context) -> Any:
        return _untyped_flag(super().get_help_option(ctx))


class ConventionalTyper(typer.Typer):
    """A Typer app whose groups and commands write conventional help (its sub-apps too, made the same way)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(cls=ConventionalGroup, **options)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **options: Any) -> Any:
        return super().command(name, cls=cls or ConventionalCommand, **options)


def _usage(argument: TyperArgument) -> str:
    """click's way: NAME, [NAME] when optional, NAME... when it takes several."""
    name = argument.metavar if argument.required else f"[{argument.metavar}]"
    return name if argument.nargs == 1 else f"{name}..."


def _untyped_flags(params: Iterable[Any]) -> None:
    for param in params:
        _untyped_flag(param)


def _untyped_flag(param: Any) -> Any:
    """A flag with an empty metavar: Typer shows an option's metavar, where it has one, in place of its type (and
    names an option by its flags in errors, never by the metavar)."""
    if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
        param.metavar = ""
    return param
