"""Time `hwprofile detect --json` as a whole process against `gpustat --json` on the same fake
8-GPU host (HGX H100 fixture, through the fake libnvidia-ml.so.1), in one run.

    python benchmarks/bench_detect.py [--runs 30]

Prints each tool's median and spread, and the ratio. Target: hwprofile median <= 100 ms and
at least 3x faster than gpustat.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import compile_package, installed_python, report, time_runs
from fakehost import build, compile_fake_nvml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--host", default="h100-sxm-8x")
    ap.add_argument(
        "--installed", action="store_true", help="time a fresh wheel install in a new venv (as users run it)"
    )
    args = ap.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory() as tmp:
        lib = compile_fake_nvml(Path(tmp) / "lib")
        host = build(args.host, Path(tmp) / "host")
        env = host.env(lib.parent)
        py = installed_python(Path(tmp), ("gpustat",)) if args.installed else sys.executable
        print(f"python: {py} ({'fresh wheel install' if args.installed else 'this environment'})")
        results = {
            "hwprofile detect --json": time_runs([py, "-m", "hwprofile", "detect", "--json"], env, args.runs),
            "gpustat --json": time_runs([py, "-m", "gpustat", "--json"], env, args.runs),
            "python -c pass (interpreter floor)": time_runs([py, "-c", "pass"], env, args.runs),
        }
    print(f"host fixture: {args.host}, {args.runs} runs each, whole processes")
    med = report(results)
    ours, peer = med["hwprofile detect --json"], med["gpustat --json"]
    print(f"  ratio gpustat / hwprofile: {peer / ours:.2f}x   (target >= 3x; hwprofile target <= 100 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
