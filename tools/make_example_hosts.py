"""Write the example host snapshots in ``examples/hosts/`` from the test fixtures, so they never drift.

Each example is what ``hwprofile detect --json`` prints on a fixture host of ``tests/fixtures/hosts/``
(built by ``tests/fakehost.py`` into a fake ``libnvidia-ml.so.1`` state and procfs/sysfs trees), with
the parts that describe the machine this tool ran on, not the example's, replaced by what a GPU host
of that kind has (:data:`SOFTWARE`, :data:`NVML_LIBRARY`)::

    python tools/make_example_hosts.py            # rewrite examples/hosts/*.json
    python tools/make_example_hosts.py --check    # exit 1 and name the files that differ

It needs what the tests need: gcc and the ``nvidia-nvml-dev`` headers (the ``dev`` extra).
``tests/test_example_hosts.py`` runs ``--check``'s comparison, and plans on every example.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "examples" / "hosts"
sys.path.insert(0, str(ROOT / "tests"))

# example file name -> the fixture it is detected from
EXAMPLES: dict[str, str] = {
    "rtx3090-1x": "rtx3090-1x",
    "rtx4090-1x": "rtx4090-1x",
    "rtx3090-2x": "rtx3090-2x",
    "a800-pcie-4x": "a800-pcie-4x-2numa",
    "a100-80g-pcie-1x": "a100-80g-pcie-1x",
    "rtx3060-12g-1x": "rtx3060-12g-1x",
    "rtx4070-12g-1x": "rtx4070-12g-1x",
    "h100-sxm-8x": "h100-sxm-8x",
}

# What detection reads off the machine it runs on rather than off the fixture: the examples say what a
# GPU host with the current vLLM release has instead (0.33.0, the newest release in
# shared/facts/vllm-options.json and hwprofile/data/vllm.json; the CUDA wheel's distribution name is
# "vllm"), the driver's library at Debian/Ubuntu's multiarch path, /dev/shm with half the RAM free.
VLLM_RELEASE = "0.33.0"
NVML_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


def software(memory_bytes: int) -> dict[str, Any]:
    return {
        "vllm_version": VLLM_RELEASE,
        "vllm_distribution": "vllm",
        "numactl_path": "/usr/bin/numactl",
        "tmpfs_path": "/dev/shm",
        "tmpfs_free_bytes": memory_bytes // 2,
    }


def detect(fixture: str, lib_dir: Path, work: Path) -> dict[str, Any]:
    """``hwprofile detect --json`` (this checkout's package) on the fixture host, as a dict."""
    from fakehost import build

    host = build(fixture, work / fixture)
    env = host.env(lib_dir)
    env.pop("HWPROFILE_NVML_LIBRARY", None)
    env["VLLM_CACHE_ROOT"] = "/nonexistent/.cache/vllm"  # vLLM's P2P cache: none, not this user's own
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "hwprofile", "detect", "--json"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"detect on {fixture} exited {proc.returncode}: {proc.stderr.strip()}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def example(fixture: str, lib_dir: Path, work: Path) -> str:
    """The example snapshot's text for ``fixture``."""
    data = detect(fixture, lib_dir, work)
    if data.get("errors"):
        raise RuntimeError(f"detect on {fixture} reported errors: {data['errors']}")
    data["driver"]["nvml_library"] = NVML_LIBRARY
    data["software"] = software(int(data["memory_bytes"]))
    return json.dumps(data, indent=2) + "\n"


def render_all(work: Path) -> dict[str, str]:
    """Every example's file name and text."""
    from fakehost import compile_fake_nvml

    lib = compile_fake_nvml(work / "lib")
    return {f"{name}.json": example(fixture, lib.parent, work) for name, fixture in EXAMPLES.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files, write nothing")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        texts = render_all(Path(tmp))
    if args.check:
        stale = [n for n, t in texts.items() if not (OUT / n).exists() or (OUT / n).read_text() != t]
        extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in texts)
        for n in stale:
            print(f"differs from its fixture: examples/hosts/{n}")
        for n in extra:
            print(f"no fixture makes: examples/hosts/{n}")
        return 1 if stale or extra else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for n, t in texts.items():
        (OUT / n).write_text(t)
        print(f"wrote examples/hosts/{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
