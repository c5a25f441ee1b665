"""The calibration `tuner plan` and `tuner launch` estimate a study's cost with where the probe cannot run: the
achieved FLOP/s of each family's whole language model, per machine kind (CPU model and threads, or GPU), taken from
the committed cell_throughput results (benchmarks/results/cell_throughput_*.json, written by
benchmarks/cell_throughput.py). The results folder is not installed, so this writes the small table the package
carries, tuner/spec/throughput.json; tests/test_cost.py checks that the table is what this derives from the results.

    PYTHONPATH=. python benchmarks/throughput_table.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TABLE = ROOT / "tuner" / "spec" / "throughput.json"
PATTERN = "cell_throughput_*.json"


def _rates(section: dict[str, Any]) -> dict[str, float]:
    """Achieved FLOP/s of each of our families' language models (the reference and reference paths left out)."""
    return {name: round(row["achieved_flops_per_second"]) for name, row in section["language_models"].items()
            if name.replace("_", "").isalnum() and not name.startswith("torch")}


def kind_of(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    machine, setup = result["machine"], result["setup"]
    device = "gpu" if machine["device"].startswith("cuda") else "cpu"
    kind = {"file": path.name, "date": result["date"], "device": device,
            "cpu": machine["cpu"], "cpu_family_model_stepping": machine["cpu_family_model_stepping"],
            "threads": machine["torch_threads"], "gpu": machine.get("gpu"), "hidden_size": setup["hidden_size"],
            "float32_matmul_precision": setup["float32_matmul_precision"],
            "word": {"vocab_size": setup["vocab_size"], "batch": setup["batch"], "bptt": setup["bptt"],
                     "flops_per_second": _rates(result)}}
    if "character_level" in result:
        character = result["character_level"]
        kind["character"] = {"vocab_size": character["setup"]["vocab_size"], "batch": character["setup"]["batch"],
                             "bptt": character["setup"]["bptt"], "flops_per_second": _rates(character)}
    return kind


def derive(results: Path = RESULTS) -> dict[str, Any]:
    return {
        "generated_by": "benchmarks/throughput_table.py from benchmarks/results/" + PATTERN,
        "flops": "matrix multiplies only: 2 per weight applied per token, x3 for forward + backward "
                 "(lm_tuner.models.flops counts a model's the same way)",
        "model": "E = H = hidden_size, 2 layers (Mogrifier r = 5, k = 40); a step is forward, cross-entropy and "
                 "backward",
        "kinds": [kind_of(path) for path in sorted(results.glob(PATTERN))],
    }


def render(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=TABLE)
    args = parser.parse_args()
    args.output.write_text(render(derive()))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
