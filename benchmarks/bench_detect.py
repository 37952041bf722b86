"""Time `hwprofile detect --json` as a whole process against `gpustat --json` on the same fake
8-GPU host (HGX H100 fixture, through the fake libnvidia-ml.so.1), in one run.

    python benchmarks/bench_detect.py [--runs 30]

Prints each tool's median and spread, and the ratio. Target: hwprofile median <= 100 ms and
at least 3x faster than gpustat.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakehost import build, compile_fake_nvml


def time_runs(cmd: list[str], env: dict[str, str], runs: int) -> list[float]:
    subprocess.run(cmd, env=env, capture_output=True, check=True)  # warm the page cache
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--host", default="h100-sxm-8x")
    args = ap.parse_args()
    # An installed package has bytecode (pip compiles on install); an editable checkout may not,
    # notably where PYTHONDONTWRITEBYTECODE is set. Compile it so both tools start alike.
    import hwprofile

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(hwprofile.__file__).parent)], check=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        lib = compile_fake_nvml(Path(tmp) / "lib")
        host = build(args.host, Path(tmp) / "host")
        env = host.env(lib.parent)
        py = sys.executable
        results = {
            "hwprofile detect --json": time_runs([py, "-m", "hwprofile", "detect", "--json"], env, args.runs),
            "gpustat --json": time_runs([py, "-m", "gpustat", "--json"], env, args.runs),
            "python -c pass (interpreter floor)": time_runs([py, "-c", "pass"], env, args.runs),
        }
    print(f"host fixture: {args.host}, {args.runs} runs each, whole processes")
    med = {}
    for name, times in results.items():
        ms = [t * 1000 for t in times]
        med[name] = statistics.median(ms)
        q = statistics.quantiles(ms, n=10)
        print(f"  {name:38s} median {med[name]:7.1f} ms   p10 {q[0]:7.1f}   p90 {q[-1]:7.1f}")
    ours, peer = med["hwprofile detect --json"], med["gpustat --json"]
    print(f"  ratio gpustat / hwprofile: {peer / ours:.2f}x   (target >= 3x; hwprofile target <= 100 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
