"""API latency on a large study, side by side with optuna-dashboard's API on the same database.

    python benchmarks/api_latency.py --output benchmarks/results/api_latency.json

Seeds a fresh PostgreSQL database (default server: 127.0.0.1:5432) with one study of 5,000 trials
(two families, 9 hyperparameters each) and 50 turns per trial — written in bulk into Optuna's and
lm-tuner's tables and checked back through Optuna's own API — then times sequential HTTP requests:
lm-tuner's API under uvicorn, optuna-dashboard's under its own CLI server. p50/p95 in milliseconds.
"""

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import optuna
from optuna.distributions import FloatDistribution, IntDistribution, distribution_to_json
from optuna.trial import TrialState
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema, optuna_storage
from lm_tuner.tuner.store.optuna_internals import optuna_models as models
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord, TurnRecord, families_column

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
STUDY = "bench"
FAMILIES = ("lstm", "mogrifier")
RERUNS = 5


def seed(url: str, trials: int, turns: int) -> None:
    ensure_schema(url)
    rng = random.Random(0)
    engine = create_engine(url)
    spec = {"name": STUDY, "families": list(FAMILIES), "parameter_budget": 24_000_000, "dataset": {"name": "ptb"},
            "search_space": {name: {"low": d.low, "high": d.high, "log": getattr(d, "log", False)}
                             for name, d in SPACE.items()},
            "tuning": {"trials": trials // len(FAMILIES)}, "resources": {"gpus_per_trial": 1.0},
            "reruns": {"top": 1, "seeds": RERUNS}, "evaluation": {"mc_samples": 200}}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    parse_spec(spec)  # what the API reads back must be a valid spec
    with engine.begin() as connection:
        connection.execute(insert(StudyRecord.__table__), [{
            "name": STUDY, "status": "complete", "spec": spec, "families": families_column(list(FAMILIES)),
            "document": "seeded by benchmarks/api_latency.py", "submitted_via": "cli", "created_at": start}])
        trial_id = 0
        for family in FAMILIES:
            study_id = connection.execute(insert(models.StudyModel.__table__).values(
                study_name=f"{STUDY}/{family}").returning(models.StudyModel.study_id)).scalar_one()
            connection.execute(insert(models.StudyDirectionModel.__table__).values(
                study_id=study_id, direction=optuna.study.StudyDirection.MINIMIZE, objective=0))
            rows: dict[str, list[dict]] = {name: [] for name in
                                           ("trials", "values", "params", "intermediate", "attrs", "ours", "turns",
                                            "evaluations")}
            for number in range(trials // len(FAMILIES)):
                trial_id += 1
                began = start + timedelta(minutes=trial_id)
                curve = sorted((4.0 + rng.random() for _ in range(turns)), reverse=True)
                rows["trials"].append({"trial_id": trial_id, "number": number, "study_id": study_id,
                                       "state": TrialState.COMPLETE, "datetime_start": began.replace(tzinfo=None),
                                       "datetime_complete": (began + timedelta(minutes=30)).replace(tzinfo=None)})
                rows["values"].append({"trial_id": trial_id, "objective": 0, "value": curve[-1],
                                       "value_type": models.TrialValueModel.TrialValueType.FINITE})
                for name, distribution in SPACE.items():
                    value = (rng.randint(distribution.low, distribution.high)
                             if isinstance(distribution, IntDistribution)
                             else rng.uniform(distribution.low, distribution.high))
                    rows["params"].append({"trial_id": trial_id, "param_name": name,
                                           "param_value": distribution.to_internal_repr(value),
                                           "distribution_json": distribution_to_json(distribution)})
                for step, value in enumerate(curve, 1):
                    rows["intermediate"].append({
                        "trial_id": trial_id, "step": step, "intermediate_value": value,
                        "intermediate_value_type":
                            models.TrialIntermediateValueModel.TrialIntermediateValueType.FINITE})
                    rows["turns"].append({"trial_id": trial_id, "turn": step, "step": step * 100,
                                          "train_loss": value + 0.1, "val_loss": value, "best_val_loss": value,
                                          "tokens_per_second": 5000.0, "wall_seconds": step * 36.0})
                for key, value in (("family", family), ("parameter_count", 23_990_000), ("hidden_size", 900)):
                    rows["attrs"].append({"trial_id": trial_id, "key": key, "value_json": json.dumps(value)})
                rows["ours"].append({"trial_id": trial_id, "study_name": STUDY, "family": family, "number": number,
                                     "stage": "tune", "parent_trial_id": None,
                                     "state": "COMPLETE", "value": curve[-1],
                                     "hidden_size": 900, "parameter_count": 23_990_000 - rng.randint(0, 5000),
                                     "seed": number, "interrupted": False, "turns_reported": turns,
                                     "wall_seconds": turns * 36.0})
            trial_id = _seed_reruns(rows, trial_id, family, rng)
            for table, key in ((models.TrialModel, "trials"), (models.TrialValueModel, "values"),
                               (models.TrialParamModel, "params"), (models.TrialIntermediateValueModel,
                                                                    "intermediate"),
                               (models.TrialUserAttributeModel, "attrs"), (TrialRecord, "ours"),
                               (TurnRecord, "turns")):
                connection.execute(insert(table.__table__), rows[key])
            connection.execute(insert(EvaluationRecord.__table__), rows["evaluations"])
        if engine.dialect.name == "postgresql":  # the ids were given explicitly: move the sequence on
            connection.execute(text("SELECT setval('trials_trial_id_seq', (SELECT max(trial_id) FROM trials))"))
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("ANALYZE"))  # as autovacuum would soon after a bulk load
    engine.dispose()


def _seed_reruns(rows: dict[str, list[dict]], trial_id: int, family: str, rng: random.Random) -> int:
    """Five reruns of the family's best trial, each with deterministic and MC test evaluations, as the
    second stage leaves them: the comparison table is computed from these."""
    best = min((row for row in rows["ours"]), key=lambda row: row["value"])
    for repeat in range(RERUNS):
        trial_id += 1
        value = best["value"] + 0.02 * rng.random()
        rows["ours"].append(best | {"trial_id": trial_id, "number": repeat, "stage": "rerun",
                                    "parent_trial_id": best["trial_id"], "value": value, "seed": 1_000_000 + repeat})
        for kind, offset in (("deterministic", 0.0), ("mc", -0.01)):
            rows["evaluations"].append({"trial_id": trial_id, "kind": kind, "valid_loss": value + offset,
                                        "test_loss": value + offset - 0.02, "logit_scale": 1.0,
                                        "settings": {"mc_samples": 200 if kind == "mc" else 0}})
    return trial_id


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(url, timeout=5).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer")
        time.sleep(0.2)


def timings(client: httpx.Client, path: str, repeats: int, warmup: int = 3) -> dict:
    return paired_timings({"only": (client, path)}, repeats, warmup)["only"]


def paired_timings(targets: dict[str, tuple[httpx.Client, str]], repeats: int, warmup: int = 3) -> dict[str, dict]:
    """Each target's latencies, the targets' requests taking turns so that load drifting during the run
    weighs on all of them alike."""
    for _ in range(warmup):
        for client, path in targets.values():
            client.get(path).raise_for_status()
    milliseconds: dict[str, list[float]] = {name: [] for name in targets}
    sizes = {}
    for _ in range(repeats):
        for name, (client, path) in targets.items():
            started = time.perf_counter()
            response = client.get(path)
            milliseconds[name].append(1000 * (time.perf_counter() - started))
            response.raise_for_status()
            sizes[name] = len(response.content)
    return {name: {"path": targets[name][1], "p50_ms": statistics.median(values),
                   "p95_ms": sorted(values)[max(0, int(round(0.95 * len(values))) - 1)],
                   "bytes": sizes[name], "requests": repeats} for name, values in milliseconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="a PostgreSQL database to create the benchmark database from")
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--list-repeats", type=int, default=500,
                        help="requests to each list endpoint, the two servers taking turns (both answer in ms)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/api_latency.json"))
    args = parser.parse_args()

    server = make_url(args.server)
    database = f"lmt_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{database}"'))
    url = server.set(database=database).render_as_string(hide_password=False)
    processes = []
    try:
        started = time.perf_counter()
        seed(url, args.trials, args.turns)
        seeding_seconds = time.perf_counter() - started
        storage = optuna_storage(url)
        counts = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage)}
        assert sum(counts.values()) == args.trials, counts
        print(f"seeded {args.trials} trials x {args.turns} turns in {seeding_seconds:.1f} s: {counts}")

        ours_port, theirs_port = free_port(), free_port()
        with tempfile.TemporaryDirectory() as artifacts:
            environment = {**os.environ, "OMP_NUM_THREADS": "1"}
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "lm_tuner.tuner",
                 "serve", "--storage", url, "--artifacts", artifacts, "--no-worker",
                 "--port", str(ours_port)], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            processes.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "optuna-dashboard"), url, "--port", str(theirs_port)],
                env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_until_up(f"http://127.0.0.1:{ours_port}/health")
            wait_until_up(f"http://127.0.0.1:{theirs_port}/api/meta")
            ours = httpx.Client(base_url=f"http://127.0.0.1:{ours_port}", timeout=120)
            theirs = httpx.Client(base_url=f"http://127.0.0.1:{theirs_port}", timeout=120)
            study_id = next(s["study_id"] for s in theirs.get("/api/studies").json()["study_summaries"]
                            if s["study_name"] == f"{STUDY}/lstm")
            measured = {
                "list": paired_timings({"lm_tuner": (ours, "/studies"), "optuna_dashboard": (theirs, "/api/studies")},
                                       args.list_repeats, warmup=20),
                "detail": {"lm_tuner": timings(ours, f"/studies/{STUDY}", args.repeats),
                           "optuna_dashboard": timings(theirs, f"/api/studies/{study_id}", args.repeats)},
                "trials_page": {"lm_tuner": timings(ours, f"/studies/{STUDY}/trials?sort=value&limit=100",
                                                    args.repeats),
                                "optuna_dashboard": timings(theirs, f"/api/studies/{study_id}", args.repeats)},
                "pareto": {"lm_tuner": timings(ours, f"/studies/{STUDY}/pareto", args.repeats),
                           "optuna_dashboard": timings(theirs, f"/api/studies/{study_id}", args.repeats)},
                "comparison": {"lm_tuner": timings(ours, f"/studies/{STUDY}/comparison", args.repeats),
                               "optuna_dashboard": timings(theirs, f"/api/studies/{study_id}", args.repeats)},
            }
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
        optuna_storage(url).engine.dispose()
        from lm_tuner.tuner.store.engine import engine_for

        engine_for(url).dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    for name, pair in measured.items():
        print(f"{name:12s} lm-tuner p50 {pair['lm_tuner']['p50_ms']:7.1f} ms p95 {pair['lm_tuner']['p95_ms']:7.1f} ms"
              f" | optuna-dashboard p50 {pair['optuna_dashboard']['p50_ms']:7.1f} ms "
              f"p95 {pair['optuna_dashboard']['p95_ms']:7.1f} ms")
    result = {
        "benchmark": "api_latency",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
        "database": "PostgreSQL " + str(server.host) + ":" + str(server.port),
        "study": {"trials": args.trials, "turns_per_trial": args.turns, "families": list(FAMILIES),
                  "hyperparameters": len(SPACE), "seeding_seconds": seeding_seconds},
        "note": ("optuna-dashboard has no paged trials, Pareto or comparison endpoint: its UI loads the study detail "
                 "(every trial of one family's Optuna study, 2,500 here) for those views, so that call is the "
                 "comparison. Sequential requests over HTTP on localhost, after 3 warm-up requests each; the list "
                 "endpoints, which both answer in milliseconds, take turns for --list-repeats requests each after 20 "
                 "warm-up requests."),
        "endpoints": measured,
        "target": {"p95_ms": 100},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
