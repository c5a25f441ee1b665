"""Rebuild the JSON schemas beside this file from their sources (README.md says which and why they are changed).

    python deploy/kubernetes/schemas/vendor.py kubernetes_validate-1.37.0-py3-none-any.whl ray.io_rayclusters.yaml

Each schema is one self-contained file (no network at validation time), without the descriptions, strict: a field
the API server does not know fails, as `kubectl apply` (strict field validation) would refuse it.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

KUBERNETES_VERSION = "v1.30.0"
CORE_KINDS = ("deployment-apps-v1", "service-v1", "persistentvolumeclaim-v1", "statefulset-apps-v1")
DEFINITIONS_REF = "/api/_definitions.json#/$defs/"
HERE = Path(__file__).parent


def without_descriptions(node: Any) -> Any:
    """The schema less its prose (a property named "description" is a schema, not a string, and stays)."""
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items()
                if not (key == "description" and isinstance(value, str))}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def referenced_definitions(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rpartition("/")[2]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(referenced_definitions(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(referenced_definitions(item) for item in node))
    return set()


def local_refs(node: Any) -> Any:
    """kubernetes-validate's refs point into a shared _definitions.json; here they point into the file's $defs."""
    if isinstance(node, dict):
        return {key: value.replace(DEFINITIONS_REF, "#/$defs/") if key == "$ref" else local_refs(value)
                for key, value in node.items()}
    if isinstance(node, list):
        return [local_refs(item) for item in node]
    return node


def with_definitions(schema: dict, definitions: dict[str, Any]) -> dict:
    """The schema with the definitions it refers to, directly or through others, as its own $defs."""
    needed, pending = set(), referenced_definitions(schema)
    while pending:
        name = pending.pop()
        needed.add(name)
        pending |= referenced_definitions(definitions[name]) - needed
    return without_descriptions({**schema, "$defs": {name: definitions[name] for name in sorted(needed)}})


def standalone_core_schema(kind_schema: dict, definitions: dict[str, Any]) -> dict:
    return with_definitions(local_refs({key: value for key, value in kind_schema.items() if key != "$id"}),
                            definitions)


def strict(node: Any) -> Any:
    """Objects with listed properties take no others, unless the CRD keeps unknown fields on purpose."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: strict(value) for key, value in node.items()}
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    return node


def raycluster_schema(crd: dict, definitions: dict[str, Any]) -> dict:
    """The CRD's v1 schema, strict; its metadata checked as the API server checks every object's (ObjectMeta)."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(without_descriptions(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["apiVersion"]["enum"] = ["ray.io/v1"]
    schema["properties"]["kind"]["enum"] = ["RayCluster"]
    schema["properties"]["metadata"] = {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    return with_definitions({"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}, definitions)


def write(name: str, schema: dict) -> None:
    (HERE / f"{name}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


def main(wheel: Path, crd_file: Path) -> None:
    folder = f"kubernetes_validate/kubernetes-json-schema/{KUBERNETES_VERSION}-local-strict"
    with zipfile.ZipFile(wheel) as archive:
        definitions = json.loads(archive.read(f"{folder}/_definitions.json"))["$defs"]
        for kind in CORE_KINDS:
            write(kind, standalone_core_schema(json.loads(archive.read(f"{folder}/{kind}.json")), definitions))
    write("raycluster-ray-v1", raycluster_schema(yaml.safe_load(crd_file.read_text()), definitions))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
