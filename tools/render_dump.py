"""Write what every CLI view and render format says about every fixture host and a few models into one
folder, a file per (host, model, command), so that a change meant to keep behaviour (a function split
into helpers, an import moved) can be diffed against the tree before it::

    mkdir /tmp/tree && git archive BASE | tar -x -C /tmp/tree
    PYTHONPATH=/tmp/tree python tools/render_dump.py /tmp/before
    rm -r /tmp/tree && mkdir /tmp/tree && git archive HEAD | tar -x -C /tmp/tree
    PYTHONPATH=/tmp/tree python tools/render_dump.py /tmp/after
    diff -r /tmp/before /tmp/after

Run both trees from the same path (the built-in profiles' paths are part of the output): the
simplest is to extract each into the same folder in turn. The fixtures
(hosts, model configs, the k8s node list) are read from this checkout; ``HWPROFILE_*`` paths and the
fake host's tmpfs free space are written as placeholders. Covered: ``detect`` (text, JSON),
``doctor``, ``plan`` (text, ``--json``, ``--explain=all``), ``render`` in every format (0.33.0, and
argv for 0.8.5), k8s with a router and a namespace, and k8s from ``tests/fixtures/k8s/nodes-mixed.json``.
It needs what the tests need: gcc and the ``nvidia-nvml-dev`` headers (the fake libnvidia-ml).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MODELS: tuple[str | None, ...] = (
    None,  # the profile's own model
    "Qwen/Qwen3-8B",
    str(ROOT / "tests/fixtures/models/qwen3.8-27b"),
    str(ROOT / "tests/fixtures/models/gpt-oss-20b"),
)
FORMATS = ("argv", "shell", "yaml", "env", "systemd", "json", "nginx", "k8s")
NODES = ROOT / "tests/fixtures/k8s/nodes-mixed.json"
_TMPFS_FREE = re.compile(r'"tmpfs_free_bytes": \d+')


class Dump:
    """Runs ``hwprofile`` in this process and writes stdout, stderr and the exit status of each call."""

    def __init__(self, out: Path, tmp: Path) -> None:
        self.out, self.tmp = out, tmp

    def __call__(self, name: str, argv: list[str]) -> str:
        from hwprofile.cli import main

        so, se = io.StringIO(), io.StringIO()
        rc: object = None
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
            except Exception:  # a crash is output too: the diff shows it
                rc = "EXC " + traceback.format_exc().splitlines()[-1]
        text = f"{so.getvalue()}\n--stderr--\n{se.getvalue()}\n--rc-- {rc}\n"
        text = _TMPFS_FREE.sub('"tmpfs_free_bytes": N', text.replace(str(self.tmp), "<TMP>"))
        (self.out / name).write_text(text)
        return so.getvalue()


def _host_env(host: Any, tmp: Path, name: str) -> None:
    """Point this process's detection at ``host`` (a ``tests/fakehost.FakeHost``)."""
    os.environ.update(
        {
            "FAKE_NVML_STATE": str(host.state),
            "HWPROFILE_PROC_ROOT": str(host.proc),
            "HWPROFILE_SYS_ROOT": str(host.sys),
            "VLLM_CACHE_ROOT": str(tmp / name / "vllm-cache"),
        }
    )


def dump_host(call: Dump, tmp: Path, name: str) -> None:
    """Every view and render of fixture host ``name``, for every model of :data:`MODELS`."""
    from fakehost import build

    _host_env(build(name, tmp / name), tmp, name)
    call(f"{name}.detect.txt", ["detect"])
    raw = call(f"{name}.detect.json", ["detect", "--json"])
    call(f"{name}.doctor.txt", ["doctor"])
    snap = tmp / f"{name}.snap.json"
    snap.write_text(_TMPFS_FREE.sub('"tmpfs_free_bytes": 1000000000', raw))  # not this machine's
    for i, model in enumerate(MODELS):
        base = ["--from", str(snap)] + (["--model", model] if model else [])
        call(f"{name}.m{i}.plan.txt", ["plan", *base])
        call(f"{name}.m{i}.plan.json", ["plan", "--json", *base])
        call(f"{name}.m{i}.plan.explain.txt", ["plan", "--explain=all", *base])
        for fmt in FORMATS:
            call(f"{name}.m{i}.render.{fmt}", ["render", "--format", fmt, "--vllm-version", "0.33.0", *base])
        call(
            f"{name}.m{i}.render.argv.0.8.5", ["render", "--format", "argv", "--vllm-version", "0.8.5", *base]
        )
        k8s = ["render", "--format", "k8s", "--vllm-version", "0.33.0", "--router-image", "r/x:1"]
        call(f"{name}.m{i}.render.k8s.router", [*k8s, "--namespace", "ns", *base])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the folder to write (made; files in it are replaced)")
    ap.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/hwprofile-render-dump"),
        help="the fake hosts' folder, emptied first: the same path on both runs (snapshots name it)",
    )
    args = ap.parse_args()
    from fakehost import compile_fake_nvml, fixture_names

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.work
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        os.environ["HWPROFILE_NVML_LIBRARY"] = str(compile_fake_nvml(tmp / "lib"))
        os.environ["HWPROFILE_CONFIG_ROOT"] = str(tmp / "etc")
        os.environ["HWPROFILE_ROUTER"] = "none"
        os.environ["HF_HUB_OFFLINE"] = "1"
        call = Dump(args.out, tmp)
        for name in fixture_names():
            dump_host(call, tmp, name)
        for i, model in enumerate(MODELS):
            k8s = ["render", "--format", "k8s", "--vllm-version", "0.33.0", "--nodes", str(NODES)]
            extra = ["--model", model] if model else []
            call(f"nodes.m{i}.render.k8s", [*k8s, *extra])
            call(f"nodes.m{i}.render.k8s.router", [*k8s, "--router-image", "r/x:1", *extra])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(list(args.out.iterdir()))} files in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
