"""Run the interconnect check: per TP group and P2P mode, one process per rank
(:mod:`.worker`) under a hard deadline; the result is a :class:`~hwprofile.plan.interconnect.Run`.

The ranks share one process group (the first rank leads it); when the deadline passes,
the whole group is killed with SIGKILL and the run is a ``hang``: hwprofile itself never waits
longer than the deadline. Outputs go to files in a private temporary directory (no pipe to fill).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from ..plan.interconnect import Report, Run, SizeResult

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

SMALL_BYTES = 32 << 10  # a decode step's all-reduce is 0.1-3 MB; 32 KiB is its latency side
LARGE_BYTES = 64 << 20  # large enough to reach the link's bandwidth on PCIe and NVLink
DEADLINE_S = 120.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(
    group: Sequence[int],
    *,
    p2p: bool,
    backend: str,
    sizes_bytes: Sequence[int] = (SMALL_BYTES, LARGE_BYTES),
    deadline_s: float = DEADLINE_S,
    iters: int = 3,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Run:
    """One all-reduce check of ``group`` (GPU indexes; on gloo just as many CPU ranks)."""
    world = len(group)
    base_env = _worker_env(group, p2p, backend, sizes_bytes, deadline_s, iters, env)
    cmd = [python or sys.executable, "-m", "hwprofile.interconnect.worker"]
    start = clock()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="hwprofile-ic-") as tmp:
        outs = []
        pgid: int | None = None
        try:
            for rank in range(world):
                out = open(os.path.join(tmp, f"{rank}.out"), "wb")  # noqa: SIM115 - closed below
                err = open(os.path.join(tmp, f"{rank}.err"), "wb")  # noqa: SIM115
                outs.append((out, err))
                p = subprocess.Popen(
                    cmd,
                    env={**base_env, "RANK": str(rank)},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    process_group=0 if pgid is None else pgid,
                )
                procs.append(p)
                if pgid is None:
                    pgid = p.pid
            hung = _wait_all(procs, start + deadline_s, clock)
        finally:
            if pgid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            for p in procs:
                p.wait()
            for out, err in outs:
                out.close()
                err.close()
        wall = clock() - start
        rows = [_rows(os.path.join(tmp, f"{r}.out")) for r in range(world)]
        errs = [_tail(os.path.join(tmp, f"{r}.err")) for r in range(world)]
    return _summarise(tuple(group), p2p, sizes_bytes, procs, rows, errs, hung, wall, deadline_s)


def _worker_env(
    group: Sequence[int],
    p2p: bool,
    backend: str,
    sizes_bytes: Sequence[int],
    deadline_s: float,
    iters: int,
    env: Mapping[str, str] | None,
) -> dict[str, str]:
    """The environment every rank's worker shares: the rendezvous, the backend, the sizes, and P2P
    on or off (NCCL_P2P_DISABLE)."""
    base_env = dict(os.environ if env is None else env)
    base_env.update(
        WORLD_SIZE=str(len(group)),
        HWPROFILE_IC_INIT=f"tcp://127.0.0.1:{_free_port()}",
        HWPROFILE_IC_BACKEND=backend,
        HWPROFILE_IC_SIZES=",".join(str(max(1, b // 4)) for b in sizes_bytes),
        HWPROFILE_IC_ITERS=str(iters),
        HWPROFILE_IC_TIMEOUT_S=str(
            int(2 * deadline_s + 60)
        ),  # our deadline fires first: a hang, not an error
        PYTHONUNBUFFERED="1",
    )
    if backend == "nccl":
        base_env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, group)))
    if p2p:
        base_env.pop("NCCL_P2P_DISABLE", None)
    else:
        base_env["NCCL_P2P_DISABLE"] = "1"
    return base_env


def _wait_all(
    procs: Sequence[subprocess.Popen[bytes]], until: float, clock: Callable[[], float], poll_s: float = 0.05
) -> bool:
    """Wait for every rank until ``until``; True when some rank was still running then. A rank that
    fails ends the wait at once: the others would wait for it until their own timeout."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return False
        if clock() >= until:
            return True
        time.sleep(poll_s)


def _rows(path: str) -> list[dict[str, Any]]:
    out = []
    with open(path, "rb") as f:
        for line in f.read(1 << 20).splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    out.append(row)
    return out


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 400))
        text = f.read().decode("utf-8", "replace").strip()
    return text.splitlines()[-1] if text else ""


def _summarise(
    group: tuple[int, ...],
    p2p: bool,
    sizes_bytes: Sequence[int],
    procs: Sequence[subprocess.Popen[bytes]],
    rows: list[list[dict[str, Any]]],
    errs: list[str],
    hung: bool,
    wall: float,
    deadline_s: float,
) -> Run:
    world = len(group)
    sizes: list[SizeResult] = []
    wrong: list[str] = []
    for i, nbytes in enumerate(sizes_bytes):
        got = [r[i] for r in rows if len(r) > i]
        if len(got) < world:
            break
        seconds = max(float(g["seconds"]) for g in got)
        exact = all(g.get("exact") is True for g in got)
        real = int(got[0]["bytes"])
        bus = 2 * (world - 1) / world * real / seconds / 1e9 if seconds > 0 else 0.0
        sizes.append(SizeResult(real, exact, seconds, bus))
        if not exact:
            bad = [
                f"rank {g['rank']}: {g['mismatches']} of {g['elements']} elements"
                for g in got
                if not g["exact"]
            ]
            wrong.append(f"{nbytes} B: " + "; ".join(bad))
    if hung:
        stuck = [r for r, p in enumerate(procs) if len(rows[r]) < len(sizes_bytes)]
        detail = f"no result within {deadline_s:g} s; killed (ranks not done: {', '.join(map(str, stuck))})"
        return Run(group, p2p, "hang", detail, tuple(sizes), wall)
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    failed.sort(key=lambda f: f[1] == -signal.SIGKILL)  # the rank that failed first; the killed ones after
    if wrong:
        return Run(group, p2p, "wrong", "wrong sum at " + " / ".join(wrong), tuple(sizes), wall)
    if failed or len(sizes) < len(sizes_bytes):
        r, rc = failed[0] if failed else (0, 0)
        detail = f"rank {r} exited with status {rc}" + (f": {errs[r]}" if errs[r] else "")
        return Run(group, p2p, "error", detail[:2000], tuple(sizes), wall)
    return Run(group, p2p, "ok", "", tuple(sizes), wall)


def run_check(
    groups: Sequence[Sequence[int]],
    *,
    fingerprint: str,
    backend: str,
    modes: Sequence[bool] = (True, False),
    driver_version: str | None = None,
    iommu: str | None = None,
    **kw: Any,
) -> Report:
    """Every group in every P2P mode (on first), one after another. ``driver_version`` and ``iommu``
    (the host's, from its snapshot) are recorded: a later plan ignores the result once either changed."""
    runs = [run_group(g, p2p=p2p, backend=backend, **kw) for g in groups for p2p in modes]
    return Report(
        fingerprint,
        backend,
        tuple(runs),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        torch_version=_torch_version(),
        driver_version=driver_version,
        iommu=iommu,
    )


def _torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None
