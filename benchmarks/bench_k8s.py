"""Time `hwprofile render --format k8s --nodes FILE` as a whole process on clusters of 50, 500, 1,000
and 5,000 nodes (the mixed cluster of tests/fixtures/k8s repeated: A800, RTX 4090 and RTX 3060 GPU
nodes and a control-plane node), against the same run's peer: `python -c` loading that node list
with the standard library's JSON parser, the floor of any tool that reads `kubectl get nodes -o json`.

    python benchmarks/bench_k8s.py [--runs 5] [--sizes 50,500,1000,5000]

Wall and CPU time, taking turns. Target (issue 34): under 1 s at 5,000 nodes.

Measured 2026-12-06 on the quiet 2-core machine (medians of 5; CPU time): 5,000 nodes (10.9 MB of
node JSON) in ~0.6 s of CPU, where `json.load` of the same file alone takes ~0.1 s; 50 nodes ~0.2 s.
The nodes are grouped by their GPU Feature Discovery labels once, then one plan per GPU class (the RTX
3060 class gets no workload: the profile's model does not fit it, said on stderr).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

from _common import compile_package, cpu_interleaved, report, script, time_interleaved

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "k8s" / "nodes-mixed.json"


def node_list(n: int, out: Path) -> Path:
    """The fixture's nodes repeated to ``n``, each with its own name."""
    data = json.loads(FIXTURE.read_text())
    items = data["items"]
    nodes = []
    for k in range(n):
        node = copy.deepcopy(items[k % len(items)])
        node["metadata"]["name"] = f"{node['metadata']['name']}-{k}"
        nodes.append(node)
    data["items"] = nodes
    out.write_text(json.dumps(data))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each command (at least 2)")
    ap.add_argument("--sizes", default="50,500,1000,5000", help="node counts, comma-separated")
    args = ap.parse_args()
    if args.runs < 2:
        ap.error("--runs: at least 2 (the report gives each command's spread)")
    compile_package()
    py = sys.executable
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "config-root"  # no site configuration: the shipped profiles only
        root.mkdir()
        cmds: dict[str, list[str]] = {}
        for n in sizes:
            nodes = node_list(n, Path(tmp) / f"nodes-{n}.json")
            render = [script(py, "hwprofile"), "render", "--format", "k8s", "--nodes", str(nodes)]
            cmds[f"render k8s, {n} nodes"] = [*render, "--config-root", str(root), "--vllm-version", "0.33.0"]
            cmds[f"json.load, {n} nodes"] = [py, "-c", f"import json; json.load(open({str(nodes)!r}))"]
        print(f"python: {py}; {args.runs} runs each, whole processes, taking turns")
        print("wall time:")
        wall = report(time_interleaved(cmds, dict(os.environ), args.runs))
        print("CPU time (user + system):")
        cpu = report(cpu_interleaved(cmds, dict(os.environ), args.runs))
    print("  nodes   render wall   render CPU   json.load CPU   render / json.load (CPU)")
    for n in sizes:
        r, j = cpu[f"render k8s, {n} nodes"], cpu[f"json.load, {n} nodes"]
        print(
            f"  {n:5d}   {wall[f'render k8s, {n} nodes']:8.1f} ms  {r:8.1f} ms   {j:10.1f} ms   {r / j:8.2f}"
        )
    print("  (target: under 1 s at 5,000 nodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
