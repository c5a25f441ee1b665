"""What the tuner itself costs: GP suggestion time vs study size, and controller overhead per trial.

    python benchmarks/tuner_overhead.py --output benchmarks/results/tuner_overhead.json

1. GP suggestion time: an Optuna study in SQLite (as studies are stored) with the 9-dimensional
   Mogrifier search space of docs/methodology.md#search-ranges, N completed trials (N = 50, 100, 200) plus 3 running
   ones, then the wall time of `ask()` — the GP's batch acquisition proposing a new trial.
2. Controller overhead: a real study (Ray Tune + GPSampler + database writes) with trials run one at
   a time; per trial, the time outside the trainer's own training loop (Ray actor start, data and
   model set-up, reporting, Optuna's ask/tell, the gap before the next trial).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the CLI sets it: GP suggestions are much faster

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna.distributions import FloatDistribution, IntDistribution  # noqa: E402
from sqlalchemy import select  # noqa: E402

SPACE = {
    "learning_rate": FloatDistribution(0.001, 0.004, log=True),
    "l2_penalty": FloatDistribution(5e-6, 1e-3, log=True),
    "input_embedding_ratio": FloatDistribution(0.0, 2.0),
    "input_dropout": FloatDistribution(0.0, 0.9),
    "inter_layer_dropout": FloatDistribution(0.0, 0.95),
    "state_dropout": FloatDistribution(0.0, 0.8),
    "output_dropout": FloatDistribution(0.0, 0.95),
    "mogrifier_rounds": IntDistribution(0, 6),
    "mogrifier_rank": IntDistribution(-20, 100),
}


def synthetic_loss(params: dict, rng: np.random.Generator) -> float:
    """A smooth bowl with noise, so the GP has real structure to fit."""
    unit = [(np.log(params[k]) if SPACE[k].log else params[k]) for k in SPACE]
    centre = [np.log(0.002), np.log(5e-5), 1.0, 0.5, 0.4, 0.3, 0.5, 5, 40]
    scale = [1.0, 2.0, 1.0, 0.5, 0.5, 0.5, 0.5, 3, 60]
    return float(4.0 + sum(((u - c) / s) ** 2 for u, c, s in zip(unit, centre, scale, strict=True))
                 + rng.normal(0, 0.02))


def gp_suggestion_seconds(completed: int, repeats: int, folder: Path) -> list[float]:
    rng = np.random.default_rng(completed)
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / f'gp-{completed}.db'}")
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.GPSampler(seed=0))
    random_sampler = optuna.samplers.RandomSampler(seed=completed)
    for _ in range(completed):
        params = {k: random_sampler.sample_independent(study, None, k, d) for k, d in SPACE.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=SPACE,
                                                  value=synthetic_loss(params, rng)))
    for _ in range(3):  # trials still running, as with concurrency > 1
        study.ask(SPACE)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        trial = study.ask(SPACE)
        seconds.append(time.perf_counter() - started)
        assert "gp:relative_params:0" in study._storage.get_trial(trial._trial_id).system_attrs
        study.tell(trial, synthetic_loss(trial.params, rng))
    return seconds


def controller_overhead(trials: int, steps_per_turn: int, folder: Path) -> dict:
    import yaml

    from lm_tuner.tuner.run.controller import launch_study
    from lm_tuner.tuner.settings import Settings
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.engine import sessions
    from lm_tuner.tuner.store.schema import TurnRecord

    document = yaml.safe_dump({
        "name": "overhead",
        "dataset": {"generator": "markov", "vocab_size": 48},
        "families": ["lstm"],
        "parameter_budget": 60000,
        "training": {"turns": 5, "steps_per_turn": steps_per_turn},
        "fixed": {"num_layers": 1},
        "search_space": {"learning_rate": {"low": 0.001, "high": 0.02, "log": True}},
        "tuning": {"sampler": "gp", "trials": trials, "startup_trials": 2, "concurrency": 1},
    })
    url = f"sqlite:///{folder / 'overhead.db'}"
    started = time.perf_counter()
    launch_study(parse_spec(document), document, Settings(url, folder / "artifacts"))
    total = time.perf_counter() - started
    frozen = optuna.load_study(study_name="overhead/lstm", storage=url).get_trials()
    with sessions(url)() as session:
        training = {t._trial_id: session.scalars(select(TurnRecord.wall_seconds).where(
            TurnRecord.trial_id == t._trial_id).order_by(TurnRecord.turn.desc())).first() for t in frozen}
    per_trial = []
    for index, trial in enumerate(frozen):
        span = (trial.datetime_complete - trial.datetime_start).total_seconds()
        gap = ((frozen[index + 1].datetime_start - trial.datetime_complete).total_seconds()
               if index + 1 < len(frozen) else 0.0)
        per_trial.append({"trial_seconds": span + gap, "training_seconds": training[trial._trial_id],
                          "overhead_seconds": span + gap - training[trial._trial_id]})
    steady = per_trial[1:]  # the first trial also pays for starting Ray
    overhead = statistics.median(t["overhead_seconds"] for t in steady)
    return {
        "trials": trials,
        "study_wall_seconds": total,
        "per_trial": per_trial,
        "median_overhead_seconds": overhead,
        "median_training_seconds": statistics.median(t["training_seconds"] for t in steady),
        "overhead_fraction_of_60s_trial": overhead / 60.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/tuner_overhead.json"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trials", type=int, default=6, help="trials of the controller-overhead study")
    parser.add_argument("--steps-per-turn", type=int, default=60)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        suggestion = {}
        for size in args.sizes:
            seconds = gp_suggestion_seconds(size, args.repeats, folder)
            suggestion[str(size)] = {"median_seconds": statistics.median(seconds), "all_seconds": seconds}
            print(f"GP suggestion with {size} completed + 3 running trials: "
                  f"median {suggestion[str(size)]['median_seconds']:.3f} s")
        overhead = controller_overhead(args.trials, args.steps_per_turn, folder)
        print(f"controller overhead per trial: median {overhead['median_overhead_seconds']:.2f} s "
              f"({100 * overhead['overhead_fraction_of_60s_trial']:.2f}% of a 60 s trial)")
    result = {
        "benchmark": "tuner_overhead",
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpu_count": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "versions": {"optuna": optuna.__version__, "python": platform.python_version()},
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "gp_suggestion": suggestion,
        "controller": overhead,
        "targets": {"gp_suggestion_seconds_at_200": 1.0, "overhead_fraction_of_60s_trial": 0.02},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
