"""Five families at one budget on Penn Treebank, through `tuner launch`: LSTM, Mogrifier LSTM, RLSTM, GRU and the
Transformer (or those `--families` names), each tuned by the same sampler over the same ranges, each trial given the
same seconds of training.

    PYTHONPATH=. python benchmarks/family_comparison.py --data /path/to/ptb \
        --output benchmarks/results/family_comparison_ptb_cpu_zen4.json
    PYTHONPATH=. python benchmarks/family_comparison.py --data /path/to/ptb --families lstm mogrifier \
        --trials 12 --trial-seconds 40 --output benchmarks/results/tuning_curves_ptb_cpu_zen4.json

A small machine's study (2 CPU cores): 3M parameters, tied embeddings (the RLSTM's residual wiring needs the
embedding as wide as the hidden state, so no family gets a narrower one), a 10k-token validation subset per turn and
each family's best rescored on the whole validation split. It writes every trial (benchmarks/real_corpus.py's
record), the plan's shapes, the study's wall time, and two figures beside the result file: the best validation
perplexity so far per family over its trials (the dashboard's history figure) and the tuning curves with their
bands (`tuner curves --figure`), as HTML and, where kaleido can drive a Chrome, PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.real_corpus import family_results, tuner, write_result
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS

FAMILIES = ("lstm", "mogrifier", "rlstm", "gru", "transformer")
FIXED = {"num_layers": 2, "input_embedding_ratio": 1.0, "tie_embeddings": True, "mogrifier_rounds": 5,
         "mogrifier_rank": 40, "attention_heads": 4, "rotary_positions": True, "context_length": 35}
"""Held fixed for the families they apply to (a study refuses a fixed value that applies to none of its families)."""


def study_name(families: tuple[str, ...]) -> str:
    return "five-families-ptb" if families == FAMILIES else f"{'-'.join(families)}-ptb".replace("_", "-")


def study_spec(data: Path, trial_seconds: float, trials: int, families: tuple[str, ...] = FAMILIES
               ) -> dict[str, Any]:
    return {
        "name": study_name(families),
        "description": f"{', '.join(families)} on PTB at 3M parameters, 2 CPU cores (benchmarks/family_comparison.py)",
        "dataset": {"format": "ptb", "path": str(data)},
        "families": list(families),
        "parameter_budget": 3_000_000,
        "training": {"budget_seconds": trial_seconds, "clock": "wall", "steps_per_turn": 100, "batch_size": 32,
                     "bptt": 35, "eval_batch_size": 32, "validation_tokens": 10_000,
                     "averaging": {"kind": "2ta"}},
        "fixed": {name: value for name, value in FIXED.items() if any(HYPERPARAMETERS[name].applies_to(family)
                                                                      for family in families)},
        "search_space": {
            "learning_rate": {"low": 0.001, "high": 0.006, "log": True},
            "input_dropout": {"low": 0.0, "high": 0.5},
            "state_dropout": {"low": 0.0, "high": 0.4},
            "output_dropout": {"low": 0.0, "high": 0.6},
        },
        "tuning": {"sampler": "gp", "trials": trials, "startup_trials": 2, "concurrency": 2, "seed": 0},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0},
    }


def write_figures(name: str, stem: Path) -> list[str]:
    """The history and tuning-curve figures of the finished study, as HTML and (with kaleido) PNG."""
    from lm_tuner.api.plots import history
    from lm_tuner.dashboards.tuning_curves import tuning_curves_figure
    from lm_tuner.tuner.analysis.tuning_curves import tuning_curves
    from lm_tuner.tuner.settings import Settings

    settings = Settings.from_options(None, None, None)
    figures = {"history": _plotly(history(name, settings).model_dump()["figure"]),
               "tuning_curves": tuning_curves_figure(tuning_curves(settings.storage_url, name, 0.95))}
    written = []
    for kind, figure in figures.items():
        html = stem.with_name(f"{stem.name}_{kind}.html")
        figure.write_html(html, include_plotlyjs="cdn")
        written.append(str(html))
        try:
            png = html.with_suffix(".png")
            figure.write_image(png, width=900, height=500)
            written.append(str(png))
        except (ImportError, ValueError, RuntimeError) as error:
            print(f"no PNG of {kind}: {error}")
    return written


def _plotly(figure: dict[str, Any]):
    import plotly.graph_objects as go

    return go.Figure(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a folder with the PTB word-level files")
    parser.add_argument("--trial-seconds", type=float, default=120.0, help="each trial's wall-clock budget")
    parser.add_argument("--trials", type=int, default=3, help="trials per family")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), help="the families to compare")
    parser.add_argument("--output", type=Path, required=True)
    arguments = parser.parse_args()
    families_compared = tuple(arguments.families)
    name = study_name(families_compared)

    with tempfile.TemporaryDirectory(prefix="family-comparison-") as folder:
        home = Path(folder)
        os.environ["LM_TUNER_HOME"] = str(home)  # the figures read the study this process's settings find
        space = home / "study.yaml"
        space.write_text(yaml.safe_dump(study_spec(arguments.data.resolve(), arguments.trial_seconds,
                                                   arguments.trials, families_compared), sort_keys=False))
        plan = json.loads(tuner("plan", "--space", str(space), "--json", home=home, timeout=600).stdout)
        started = time.monotonic()
        launch = tuner("launch", "--space", str(space), home=home, timeout=4 * 3600)
        study_seconds = time.monotonic() - started
        trials = json.loads(tuner("export", name, "--format", "json", home=home, timeout=600).stdout)
        curves = tuner("curves", name, home=home, timeout=600).stdout
        figures = write_figures(name, arguments.output.with_suffix(""))

    families = {family: family_results(trials, family) for family in families_compared}
    result = {
        "benchmark": "family_comparison",
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "spec": study_spec(Path("PTB"), arguments.trial_seconds, arguments.trials, families_compared),
        "plan": plan,
        "study_wall_seconds": study_seconds,
        "families": families,
        "tuning_curves_output": curves,
        "figures": [Path(path).name for path in figures],
        "launch_output_tail": launch.stdout[-3000:],
    }
    write_result(arguments.output, result)
    print(f"study {study_seconds:.0f} s; figures: {', '.join(figures)}")


if __name__ == "__main__":
    main()
