"""`tuner data`: the dataset registry from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

data_app = typer.Typer(help="Download and verify the registered datasets.", no_args_is_help=True)
errors = Console(stderr=True, highlight=False)


@data_app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="ptb, ptb-char, wikitext-2, wikitext-103, enwik8 or text8")],
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", metavar="DIR", help="where datasets are kept [default: $LM_TUNER_DATA, "
                                           "else ~/.cache/lm-tuner/datasets]")] = None,
) -> None:
    """Download a registered dataset into the cache (once) and verify its checksums.

    Exit status: 0 the files are in place and verified, 1 the download or the check failed,
    2 no such dataset.
    """
    from lm_tuner.trainers.checksums import CHECKSUMS, read_checksums
    from lm_tuner.trainers.registry import fetch_dataset, registered

    try:
        dataset = registered(name)
    except KeyError as error:
        errors.print(f"[red]{error.args[0]}[/red]")
        raise typer.Exit(2) from error
    try:
        folder = fetch_dataset(dataset, cache_dir)
    except (RuntimeError, ValueError) as error:
        errors.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from error
    recorded = read_checksums(folder / CHECKSUMS)
    typer.echo(f"{dataset.name}: {dataset.description}\n{folder}")
    for file in dataset.members:
        source = "pinned in the registry" if file in dataset.sha256 else f"recorded in {CHECKSUMS} at first download"
        typer.echo(f"{recorded[file]}  {file}  ({(folder / file).stat().st_size:,} bytes, {source})")
