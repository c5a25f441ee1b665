"""deploy/: the SLURM template (syntax, and dry runs with stand-ins for srun, ray, tuner... that record their
arguments) and the Kubernetes manifests (validated offline against the vendored schemas, and wired together)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

ROOT = Path(__file__).parent.parent
SBATCH = ROOT / "deploy" / "slurm" / "lm-tuner.sbatch"
KUBERNETES = ROOT / "deploy" / "kubernetes"
SCHEMAS = {("apps/v1", "Deployment"): "deployment-apps-v1.json", ("apps/v1", "StatefulSet"): "statefulset-apps-v1.json",
           ("v1", "Service"): "service-v1.json", ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1.json",
           ("ray.io/v1", "RayCluster"): "raycluster-ray-v1.json"}
CHECKER = Path(sys.executable).parent / "check-jsonschema"
STORAGE = "postgresql+psycopg://tuner:secret@db-host/tuner"

# One stand-in for every program the script calls: it records its arguments and Ray's variables, then acts the
# part: srun runs its command here, `ray status` lists the nodes whose `ray start` ran (at most $STUB_MAX_NODES).
STUB = """#!{python}
import json, os, sys
from itertools import dropwhile
from pathlib import Path

name, args, log = Path(sys.argv[0]).name, sys.argv[1:], Path(os.environ["STUB_LOG"])
if name == "ray" and args[0] == "status":
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    started = sum(call["program"] == "ray" and call["args"][0] == "start" for call in calls)
    joined = min(started, int(os.environ.get("STUB_MAX_NODES", "99")))
    if not joined:
        sys.exit("ConnectionError: could not reach the GCS")
    nodes = "".join(f" 1 node_{{number:056x}}\\n" for number in range(joined))
    print(f"Node status\\nActive:\\n{{nodes}}Pending:\\n (no pending nodes)\\nRecent failures:\\n (no failures)")
    sys.exit(0)
with log.open("a") as out:
    variables = {{key: os.environ.get(key) for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                                      "LM_TUNER_STORAGE", "LM_TUNER_ARTIFACTS")}}
    out.write(json.dumps({{"program": name, "args": args, "env": variables}}) + "\\n")
if name == "srun":
    command = list(dropwhile(lambda word: word.startswith("-"), args))
    if command[0] == "test" and os.environ.get("STUB_UNSHARED"):
        sys.exit(1)
    os.execvp(command[0], command)
if name == "scontrol":
    print("node1\\nnode2\\nnode3")
if name == "hostname":
    print("fe80::1 10.1.2.3 10.9.9.9")
"""


def dry_run(tmp_path: Path, *arguments: str, **variables: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "stub").write_text(STUB.format(python=sys.executable))
    (stubs / "stub").chmod(0o755)
    for program in ("srun", "scontrol", "hostname", "ray", "tuner"):
        (stubs / program).unlink(missing_ok=True)
        (stubs / program).symlink_to(stubs / "stub")
    (stubs / "sleep").write_text("#!/bin/sh\n")  # the polls go round without waiting
    (stubs / "sleep").chmod(0o755)
    log = tmp_path / "calls.jsonl"
    environment = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_LOG": str(log),
                   "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3",
                   "SLURMD_NODENAME": "node1", "SLURM_CPUS_PER_TASK": "32", "SLURM_GPUS_PER_NODE": "a100:4",
                   "LM_TUNER_STORAGE": STORAGE, "LM_TUNER_ARTIFACTS": str(tmp_path / "artifacts"), **variables}
    run = subprocess.run(["bash", str(SBATCH), *arguments], env={k: v for k, v in environment.items() if v},
                         capture_output=True, text=True, timeout=60)
    return run, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_sbatch_is_valid_bash_with_the_directives_a_cluster_needs():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True).returncode == 0
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", SBATCH.read_text(), flags=re.MULTILINE))
    assert {"nodes", "cpus-per-task", "gpus-per-node", "time"} <= set(directives)
    assert directives["ntasks-per-node"] == "1"  # one Ray node per machine


def test_sbatch_starts_the_head_then_the_workers_then_the_runner(tmp_path):
    run, calls = dry_run(tmp_path, "--poll-seconds", "5")
    assert run.returncode == 0, run.stderr
    steps = [call for call in calls if call["program"] == "srun"]
    assert steps[0]["args"][:2] == ["--nodes=3", "--ntasks-per-node=1"] and steps[0]["args"][2:4] == ["test", "-e"]
    placed = {next(word for word in step["args"] if word.startswith("--nodelist=")): step["args"] for step in steps[1:]}
    assert set(placed) == {"--nodelist=node1", "--nodelist=node2", "--nodelist=node3"}
    for step in placed.values():
        assert {"--cpus-per-task=32", "--gpus-per-node=a100:4"} <= set(step)
    head = placed["--nodelist=node1"][placed["--nodelist=node1"].index("ray"):]
    assert head[:3] == ["ray", "start", "--head"]
    assert {"--block", "--node-ip-address=10.1.2.3", "--port=6379", "--num-cpus=32", "--num-gpus=4"} <= set(head)
    order = [(call["program"], call["args"][:2]) for call in calls if call["program"] in ("ray", "tuner")]
    assert order[0] == ("ray", ["start", "--head"]) and order[1:3] == [("ray", ["start", "--block"])] * 2
    workers = [call["args"] for call in calls if call["program"] == "ray"][1:]
    assert all({"--address=10.1.2.3:6379", "--num-gpus=4"} <= set(worker) for worker in workers)
    tuner = [call for call in calls if call["program"] == "tuner"]
    # The database's URL, password and all, reaches tuner through its environment: a command line is anyone's (ps).
    assert [call["args"] for call in tuner] == [["db", "upgrade"], ["worker", "--poll-seconds", "5"]]
    assert all(call["env"]["LM_TUNER_STORAGE"] == STORAGE for call in tuner)
    assert all(call["env"]["LM_TUNER_ARTIFACTS"] == str(tmp_path / "artifacts") for call in tuner)
    assert not [call for call in calls if any("secret" in argument for argument in call["args"])]
    assert order[3:] == [("tuner", ["db", "upgrade"]), ("tuner", ["worker", "--poll-seconds"])]
    # One token for the job, known to every Ray node and to the driver; the driver finds the head by RAY_ADDRESS.
    ray_variables = {json.dumps(call["env"]) for call in calls if call["program"] in ("ray", "tuner")}
    (shared,) = [json.loads(variables) for variables in ray_variables]
    assert shared["RAY_ADDRESS"] == "10.1.2.3:6379" and shared["RAY_AUTH_MODE"] == "token"
    assert re.fullmatch(r"[0-9a-f]{64}", shared["RAY_AUTH_TOKEN"])
    assert list((tmp_path / "artifacts").iterdir()) == []  # the shared-folder probe cleaned up after itself


@pytest.mark.parametrize(("variables", "message"), [
    ({"LM_TUNER_STORAGE": ""}, "set LM_TUNER_STORAGE to the PostgreSQL URL"),
    ({"LM_TUNER_STORAGE": "sqlite:////home/me/private.db"}, "must be a PostgreSQL URL"),
    ({"LM_TUNER_ARTIFACTS": "artifacts"}, "set LM_TUNER_ARTIFACTS to an absolute path"),
    ({"STUB_UNSHARED": "1"}, "not visible from every node"),
    # long enough for the head's own `ray start` (a background process) to register on a loaded machine
    ({"STUB_MAX_NODES": "1", "LM_TUNER_RAY_WAIT_SECONDS": "8"}, "only 1 of 3 Ray nodes joined within 8s"),
])
def test_sbatch_stops_with_a_clear_message(tmp_path, variables, message):
    run, calls = dry_run(tmp_path, **variables)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "private.db" not in run.stderr  # the URL may hold a password: never echoed
    assert not [call for call in calls if call["program"] == "tuner"]
    assert not (tmp_path / "artifacts").exists() or list((tmp_path / "artifacts").iterdir()) == []


def documents() -> list[dict]:
    return [document for path in sorted(KUBERNETES.glob("*.yaml")) for document in yaml.safe_load_all(path.read_text())]


def find(kind: str, name: str) -> dict:
    return next(each for each in documents() if (each["kind"], each["metadata"]["name"]) == (kind, name))


def check(instances: list[dict], folder: Path) -> dict[str, subprocess.CompletedProcess]:
    """check-jsonschema on each document with the vendored schema of its kind (no network), one run per kind."""
    by_schema: dict[str, list[Path]] = {}
    for number, document in enumerate(instances):
        instance = folder / f"{number}-{document['kind']}.json"
        instance.write_text(json.dumps(document))
        by_schema.setdefault(SCHEMAS[(document["apiVersion"], document["kind"])], []).append(instance)
    return {schema: subprocess.run([str(CHECKER), "--schemafile", str(KUBERNETES / "schemas" / schema),
                                    *map(str, files)], capture_output=True, text=True)
            for schema, files in by_schema.items()}


def test_manifests_validate_against_the_vendored_schemas(tmp_path):
    assert {(document["apiVersion"], document["kind"]) for document in documents()} == set(SCHEMAS)
    for schema, run in check(documents(), tmp_path).items():
        assert run.returncode == 0, f"{schema}: {run.stdout}{run.stderr}"


def test_the_schemas_refuse_what_the_api_server_would(tmp_path):
    """Strict: a misspelt field fails, as `kubectl apply` refuses it; so does a wrong type, metadata included."""
    broken = []
    for document in documents():
        misspelt, wrong_type = copy.deepcopy(document), copy.deepcopy(document)
        misspelt["spec"]["replica"] = 1
        wrong_type["metadata"]["labels"] = ["not", "a", "map"]
        broken += [misspelt, wrong_type]
    runs = check(broken, tmp_path)
    assert all(run.returncode == 1 for run in runs.values())
    reported = set(re.findall(r"\d+-\w+\.json", "".join(run.stdout for run in runs.values())))
    assert reported == {path.name for path in tmp_path.glob("*.json")}


def environment(container: dict) -> dict[str, dict | str]:
    return {variable["name"]: variable.get("valueFrom", variable.get("value")) for variable in container.get("env", [])}


def pod_templates(document: dict) -> dict[str, dict]:
    spec = document["spec"]
    if "template" in spec:
        return {document["metadata"]["name"]: spec["template"]}
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]] if document["kind"] == "RayCluster" else []
    return {group.get("groupName", "head"): group["template"] for group in groups}


def test_runner_is_a_ray_node_that_runs_tuner_worker(tmp_path):
    """Its command, run here on KubeRay's generated `ray start`: the node joins without --block, then the runner."""
    cluster = find("RayCluster", "lm-tuner")
    (runner,) = [group for group in cluster["spec"]["workerGroupSpecs"] if group["groupName"] == "runner"]
    assert (runner["replicas"], runner["minReplicas"], runner["maxReplicas"]) == (1, 1, 1)
    assert runner["rayStartParams"]["num-cpus"] == "0"
    assert runner["template"]["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    (container,) = runner["template"]["spec"]["containers"]
    flags = ("address=lm-tuner-head-svc:6379", "block", "memory=4294967296", "num-cpus=0")
    generated = "ray start " + "".join(f" --{flag} " for flag in flags)  # KubeRay's spacing
    log = tmp_path / "calls.log"
    for program in ("ray", "tuner"):
        (tmp_path / program).write_text(f'#!/bin/sh\necho "{program} $*" >> {log}\n')
        (tmp_path / program).chmod(0o755)
    run = subprocess.run([*container["command"], *container["args"]], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin", "KUBERAY_GEN_RAY_START_CMD": generated})
    assert run.returncode == 0, run.stderr
    assert log.read_text().splitlines() == [
        "ray start --address=lm-tuner-head-svc:6379 --memory=4294967296 --num-cpus=0", "tuner db upgrade",
        "tuner worker"]
    assert Version(cluster["spec"]["rayVersion"]) >= Version("2.52.0")  # KubeRay's token authentication needs it
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_trial_runners_and_the_api_share_the_artifact_store():
    claim = find("PersistentVolumeClaim", "lm-tuner-shared")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    templates = {**pod_templates(find("RayCluster", "lm-tuner")), **pod_templates(find("Deployment", "lm-tuner-api"))}
    for name in ("gpu", "runner", "lm-tuner-api"):
        (volume,) = templates[name]["spec"]["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == "lm-tuner-shared", name
        (container,) = templates[name]["spec"]["containers"]
        (mount,) = [each["mountPath"] for each in container["volumeMounts"] if each["name"] == volume["name"]]
        assert environment(container)["LM_TUNER_ARTIFACTS"].startswith(mount + "/"), name
    (gpu,) = templates["gpu"]["spec"]["containers"]
    assert gpu["image"] == "lm-tuner:cuda" and gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    mount = gpu["volumeMounts"][0]["mountPath"]
    assert environment(gpu)["TRITON_CACHE_DIR"].startswith(mount + "/")


def test_api_listens_with_authentication_on_and_secrets_from_a_secret():
    api, service = find("Deployment", "lm-tuner-api"), find("Service", "lm-tuner-api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    command = container["args"]
    assert command[0] == "serve" and command[command.index("--host") + 1] == "0.0.0.0"
    assert "--no-worker" in command and "--insecure" not in command and "--initial-token" in command
    assert environment(container)["LM_TUNER_API_TOKEN"] == {"secretKeyRef": {"name": "lm-tuner-secrets",
                                                                            "key": "api-token"}}
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in [each["name"] for each in container["ports"]]
    # A database URL holds its password: every container takes it from the Secret, none spells it out.
    storage = [environment(container).get("LM_TUNER_STORAGE") for document in documents()
               for template in pod_templates(document).values()
               for container in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]]
    assert [url for url in storage if url] == [{"secretKeyRef": {"name": "lm-tuner-secrets", "key": "storage-url"}}] * 3


def help_text(*command: str) -> str:
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *command, "--help"], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}).stdout


def options(*command: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z-]+", help_text(*command)))


def test_the_templates_use_options_the_cli_has():
    (api,) = find("Deployment", "lm-tuner-api")["spec"]["template"]["spec"]["containers"]
    assert {word for word in api["args"] if word.startswith("--")} <= options("serve")
    # The SLURM template hands the database and the artifact folder on in the variables the commands default to.
    assert "[default: $LM_TUNER_STORAGE" in help_text("db", "upgrade")
    assert {"[default: $LM_TUNER_STORAGE", "[default: $LM_TUNER_ARTIFACTS"} <= set(
        re.findall(r"\[default: \$LM_TUNER_[A-Z]+", help_text("worker")))
    assert 'export LM_TUNER_STORAGE LM_TUNER_ARTIFACTS\ntuner db upgrade\nexec tuner worker "$@"' in SBATCH.read_text()
