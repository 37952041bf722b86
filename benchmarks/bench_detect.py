"""Time `hwprofile detect --json` as a whole process against `gpustat --json` on the same fake
8-GPU host (HGX H100 fixture, through the fake libnvidia-ml.so.1), in one run.

    python benchmarks/bench_detect.py [--runs 30] [--installed]

Both are run as users run them, through their console scripts, taking turns. Prints each median and
spread, the ratio, and two references from the same run: the bare interpreter and
`python -c "import pynvml"` (NVML's Python binding alone: a cost any NVML client pays).
Target: hwprofile median <= 100 ms and at least 3x faster than gpustat.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import compile_package, installed_python, report, script, time_interleaved
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
        results = time_interleaved(
            {
                "hwprofile detect --json": [script(py, "hwprofile"), "detect", "--json"],
                "gpustat --json": [script(py, "gpustat"), "--json"],
                "python -c 'import pynvml'": [py, "-c", "import pynvml"],
                "python -c pass (interpreter floor)": [py, "-c", "pass"],
            },
            env,
            args.runs,
        )
    print(f"host fixture: {args.host}, {args.runs} runs each, whole processes, taking turns")
    med = report(results)
    ours, peer = med["hwprofile detect --json"], med["gpustat --json"]
    binding = med["python -c 'import pynvml'"]
    print(f"  ratio gpustat / hwprofile: {peer / ours:.2f}x   (target >= 3x; hwprofile target <= 100 ms)")
    print(f"  hwprofile above `import pynvml` alone: {ours - binding:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
