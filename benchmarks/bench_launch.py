"""Time from launch to ready: `hwprofile launch --foreground` against plain `vllm serve` with the same
arguments, model and environment (rendered by hwprofile), on the tiny model, alternating, in one run.

    python benchmarks/bench_launch.py [--runs 3]

Prints each median and the ratio hwprofile / plain (target <= 1.05). Needs vLLM installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout: float = 600) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter()
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready in time")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(3)  # let the port and the children go


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from hwprofile.launch.tinymodel import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        sets = [
            "--set",
            "engine.max_model_len=512",
            "--set",
            "cpu.kv_cache_space_gib=0.0625",
            "--set",
            "speculative.method=none",
            "--set",
            "server.port=18555",
            "--set",
            f"logs.dir={tmp}/logs",
        ]
        env = {**os.environ, "HWPROFILE_RUNTIME_DIR": f"{tmp}/rt", "HWPROFILE_CONFIG_ROOT": f"{tmp}/etc"}
        rendered = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hwprofile",
                    "render",
                    "--format",
                    "json",
                    "--model",
                    str(model),
                    *sets,
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        plain_env = {**os.environ, **rendered["env"], "TMPDIR": tmp, "VLLM_CACHE_ROOT": f"{tmp}/plain-cache"}
        url = "http://127.0.0.1:18555"
        times: dict[str, list[float]] = {"hwprofile launch": [], "plain vllm serve": []}
        for _ in range(args.runs):
            t0 = time.perf_counter()
            p = subprocess.Popen(
                [sys.executable, "-m", "hwprofile", "launch", "--foreground", "--model", str(model), *sets],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            times["hwprofile launch"].append(wait_health(url, p) - t0)
            stop_group(p)
            t0 = time.perf_counter()
            p = subprocess.Popen(
                rendered["argv"],
                env=plain_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            times["plain vllm serve"].append(wait_health(url, p) - t0)
            stop_group(p)
    for name, ts in times.items():
        print(
            f"  {name:18s} median {statistics.median(ts):6.1f} s   runs {', '.join(f'{t:.1f}' for t in ts)}"
        )
    ratio = statistics.median(times["hwprofile launch"]) / statistics.median(times["plain vllm serve"])
    print(f"  ratio hwprofile / plain: {ratio:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
