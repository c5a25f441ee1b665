"""`tuner curves`: each family's tuning curve — the expected best score after n trials, the median best with
its confidence band — as a table, the verdict in words, and optionally the figure as HTML or PNG."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from lm_tuner.tuner.cli.common import (
    PlainTable,
    StorageOption,
    console,
    no_such_study,
    output_file,
    refuse,
    settings_for_reading,
    unclipped,
)

FIGURE_SUFFIXES = (".html", ".png")


def curves(
    name: Annotated[str, typer.Argument(help="study name")],
    confidence: Annotated[float, typer.Option(
        help="probability, 0.5 to 0.999, that every family's band holds at once (each at "
             "confidence^(1/families))")] = 0.95,
    figure: Annotated[Optional[Path], typer.Option(
        "--figure", metavar="PATH.html|PATH.png",
        help="also write the figure: .html (plotly, opens offline in a browser) or .png (needs kaleido, the "
             "'figures' extra, and a Chrome or Chromium)")] = None,
    storage: StorageOption = None,
) -> None:
    """Tuning curves: per family, the expected best validation score after n = 1 … N complete tuning trials
    (Dodge et al. 2019) and the median best with a distribution-free band that holds at every n at once
    (Lourie et al. 2024, opda), then which family is better at which n with that confidence. Exit status 1 for
    an unknown study, 2 for a confidence or figure path it refuses."""
    from lm_tuner.dashboards.tuning_curves import tuning_curves_figure
    from lm_tuner.tuner.analysis.tuning_curves import CONFIDENCE_RANGE, tuning_curves

    low, high = CONFIDENCE_RANGE
    if not low <= confidence <= high:
        refuse(f"--confidence must be in [{low}, {high}], not {confidence}")
    if figure is not None:
        _check_figure_path(figure)
    settings = settings_for_reading(storage)
    found = tuning_curves(settings.storage_url, name, confidence)
    if found is None:
        no_such_study(settings, name, 1)
    digits = 3 if found.unit.name == "bpc" else 2
    band = f"{confidence * 100:g}% band"
    for curve in found.families:
        table = PlainTable("n", f"expected best ({found.unit.name})", f"median best ({found.unit.name})", band,
                           title=f"{curve.family}: {curve.trials} complete tuning trials")
        for point, expected in zip(curve.points, curve.expected_best_scores, strict=True):
            low, high = found.unit.of(point.lower), found.unit.of(point.upper)
            upper = f"{high:.{digits}f}" if math.isfinite(high) else "∞"
            table.add_row(str(point.n), f"{expected:.{digits}f}", f"{found.unit.of(point.median_best):.{digits}f}",
                          f"{low:.{digits}f} – {upper}")
        console.print(unclipped(table))
    console.print(f"method: {found.method}", style="dim", markup=False)
    console.print(found.verdict, markup=False)
    if figure is not None:
        drawn = tuning_curves_figure(found)
        if figure.suffix == ".html":
            drawn.write_html(figure, include_plotlyjs=True)
        else:
            drawn.write_image(figure)
        console.print(f"figure written to {figure}", markup=False)


def _check_figure_path(figure: Path) -> None:
    if figure.suffix not in FIGURE_SUFFIXES:
        refuse(f"--figure: {figure} must end in one of {', '.join(FIGURE_SUFFIXES)}")
    if figure.suffix == ".png" and importlib.util.find_spec("kaleido") is None:
        refuse("--figure: writing PNG needs the kaleido package (pip install 'lm-tuner[figures]') and a Chrome it "
               "can drive; write .html instead")
    output_file(figure, "--figure")
