"""Kubernetes renders the API server would refuse (tests/hostile/k8s.json): node names that are no
node names (left out, said so, never in a manifest), 10,000 nodes in one class (their names summed up:
an object's annotations stay under the API server's 256 KiB), one GPU product in two memory sizes (two
workloads, two names, each selecting its own nodes)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_k8s import NODES_MIXED, clean_env, render  # noqa: F401 (the fixture is used by name)

from hwprofile.render.k8s.nodes import node_classes, valid_node_name

CASES = json.loads((Path(__file__).parent / "hostile" / "k8s.json").read_text())
ANNOTATIONS_LIMIT = 256 * 1024


def _ws4090() -> dict[str, Any]:
    return next(n for n in json.loads(NODES_MIXED.read_text())["items"] if n["metadata"]["name"] == "ws-4090")


def _clone(name: Any, memory: int | None = None) -> dict[str, Any]:
    node = copy.deepcopy(_ws4090())
    node["metadata"]["name"] = name
    if memory is not None:
        node["metadata"]["labels"]["nvidia.com/gpu.memory"] = str(memory)
    return node


def _annotation_bytes(obj: Any) -> list[int]:
    """The bytes of every ``annotations`` map in ``obj`` (an object's own and its pod templates')."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "annotations" and isinstance(v, dict):
                out.append(sum(len(str(a).encode()) + len(str(b).encode()) for a, b in v.items()))
            else:
                out += _annotation_bytes(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _annotation_bytes(v)
    return out


@pytest.mark.parametrize("case", CASES["names"], ids=[c["id"] for c in CASES["names"]])
def test_a_node_name_the_api_server_refuses_is_left_out(case) -> None:
    name = case["name"] * case["repeat"] if "repeat" in case else case["name"]
    assert not valid_node_name(name)
    classes, warnings = node_classes({"items": [_clone(name), _clone("gpu-ok-1")]}, "0.33.0")
    assert [c.nodes for c in classes] == [("gpu-ok-1",)]
    (w,) = [w for w in warnings if "not a Kubernetes node name" in w]
    assert w.startswith("items[0]: metadata.name") and len(w) < 400  # said, and shortly


def test_ten_thousand_nodes_keep_annotations_under_the_limit(capsys, clean_env, empty_root, tmp_path) -> None:  # noqa: F811
    n, width = CASES["many"]["nodes"], CASES["many"]["name_length"]
    names = [f"gpu-node-{i:05d}-".ljust(width, "x") for i in range(n)]
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "List", "items": [_clone(name) for name in names]}))
    docs, text, _err = render(capsys, "--nodes", str(path), "--config-root", str(empty_root))
    assert docs and all(total <= ANNOTATIONS_LIMIT for d in docs for total in _annotation_bytes(d))
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    summary = dep["metadata"]["annotations"]["hwprofile.io/nodes"]
    assert summary.startswith(f"{n} nodes, sha256 ") and names[0] in summary and len(summary) <= 4096
    assert dep["spec"]["replicas"] == n
    assert len(text) < 4 << 20  # the names are not copied into every object


def test_one_product_in_two_memory_sizes_is_two_workloads(capsys, clean_env, empty_root, tmp_path) -> None:  # noqa: F811
    small, large = CASES["memory_sizes"]
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "List", "items": [_clone("ws-a", small), _clone("ws-b", large)]}))
    docs, text, _err = render(capsys, "--nodes", str(path), "--config-root", str(empty_root))
    deps = [d for d in docs if d["kind"] == "Deployment"]
    names = [d["metadata"]["name"] for d in deps]
    assert len(deps) == 2 and len(set(names)) == 2, names
    assert all(len(x) <= 63 for x in names)
    selectors = {
        d["metadata"]["annotations"]["hwprofile.io/nodes"]: d["spec"]["template"]["spec"]["nodeSelector"]
        for d in deps
    }
    assert selectors["ws-a"]["nvidia.com/gpu.memory"] == str(small)
    assert selectors["ws-b"]["nvidia.com/gpu.memory"] == str(large)
    assert len({d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}) == 2
    yaml.safe_load_all(text)
