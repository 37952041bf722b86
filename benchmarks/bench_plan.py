"""Time `hwprofile plan --json` as a whole process on the fake 4x A800 host (seed 000's machine),
against `hwprofile detect --json` (its own first stage) and the bare interpreter, in one run.

    python benchmarks/bench_plan.py [--runs 20] [--installed]

Run through the console script, as users run it, taking turns; every run parses the YAML profiles
and data (nothing is cached between runs). The first run after the install is reported on its own.
Target: median <= 150 ms. Also checks that planning imports neither vllm nor torch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import compile_package, first_run, installed_python, report, script, time_interleaved
from fakehost import build, compile_fake_nvml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument(
        "--installed", action="store_true", help="time a fresh wheel install in a new venv (as users run it)"
    )
    args = ap.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory() as tmp:
        py = installed_python(Path(tmp)) if args.installed else sys.executable
        hw = script(py, "hwprofile")
        print(f"python: {py} ({'fresh wheel install' if args.installed else 'this environment'})")
        lib = compile_fake_nvml(Path(tmp) / "lib")
        host = build("a800-pcie-4x-2numa", Path(tmp) / "host")
        env = {
            **host.env(lib.parent),
            "HWPROFILE_CONFIG_ROOT": str(Path(tmp) / "etc"),
        }
        cold = first_run([hw, "plan", "--json"], env)
        snap = Path(tmp) / "snap.json"
        snap.write_text(
            subprocess.run(
                [hw, "detect", "--json"], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        results = time_interleaved(
            {
                "hwprofile plan --json (detects)": [hw, "plan", "--json"],
                "hwprofile plan --json --from snapshot": [hw, "plan", "--json", "--from", str(snap)],
                "hwprofile detect --json": [hw, "detect", "--json"],
                "python -c pass (interpreter floor)": [py, "-c", "pass"],
            },
            env,
            args.runs,
        )
        probe = (
            "import sys, io, contextlib; from hwprofile.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['plan', '--json'])\n"
            "print(sorted(m for m in ('vllm', 'torch', 'transformers', 'jinja2') if m in sys.modules))"
        )
        heavy = subprocess.run(
            [py, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
    print(
        f"host fixture: a800-pcie-4x-2numa, model Qwen/Qwen3-32B (catalog), {args.runs} runs each, taking turns"
    )
    med = report(results)
    floor = med["python -c pass (interpreter floor)"]
    print(f"  first run: {cold * 1000:.1f} ms")
    print(
        f"  plan above the interpreter floor: {med['hwprofile plan --json (detects)'] - floor:.1f} ms; "
        f"heavy modules imported by plan: {heavy}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
