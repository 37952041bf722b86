"""The churn soak: the daemon's real loop for ``--minutes`` of simulated time (one tick per simulated
second, run as fast as the loop goes) with faults injected, checked at every tick (tests/soak.py).

    python benchmarks/soak_daemon.py [--minutes 20] [--seed 1]

GPU 0 flips across hot every 40 s with a third of its temperature reads failing; one instance is killed
every 3 min (its supervisor brings it back); an override is rewritten every 2 min (a reload); the runtime
directory is deleted every 10 min (a --user unit at logout). Printed: the invariants (no recover on a tick
whose reading was not made, one degrade and one recover per hot episode, never two instances restarted at
once, no instance lost, one owner of the runtime directory), the loop's own CPU per tick, and this
process's RSS and open descriptors at the start and the end (flat: nothing the daemon keeps grows).
``tests/test_daemon_cost.py`` runs a compressed version in the suite.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    logging.getLogger("hwprofile").setLevel(logging.CRITICAL)  # the figures, not the daemon's log
    from soak import soak

    with tempfile.TemporaryDirectory(prefix="hwps-") as tmp:
        soak(Path(tmp) / "warm", 120, seed=args.seed)  # imports, caches: not what is measured
        rss0, fds0 = rss_mb(), len(os.listdir("/proc/self/fd"))
        c0, t0 = time.process_time(), time.perf_counter()
        res = soak(Path(tmp) / "rt", args.minutes * 60, seed=args.seed)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        rss1, fds1 = rss_mb(), len(os.listdir("/proc/self/fd"))
    print(f"churn soak: {res.ticks} ticks ({args.minutes:g} simulated minutes) in {wall:.1f} s")
    print(
        f"  injected: {res.episodes} hot episodes, {res.crashes} kills, {res.reloads} override rewrites, "
        f"{res.runtime_deleted} runtime directory deletions"
    )
    print(f"  actions: {dict(res.actions)}; at most {res.max_in_flight} instance(s) restarted at once")
    bad = [ep for ep in res.per_episode if ep != (1, 1)]
    print(
        f"  one degrade + one recover per finished episode: {len(res.per_episode) - len(bad)} of "
        f"{len(res.per_episode)}"
    )
    print(f"  loop CPU per tick {1000 * cpu / max(1, res.ticks):.2f} ms (fakes and daemon.json included)")
    print(f"  RSS {rss0:.1f} -> {rss1:.1f} MB, open descriptors {fds0} -> {fds1}; kept: {res.bounded}")
    print(f"  invariants: {'all held' if not res.violations else f'{len(res.violations)} broken'}")
    for v in res.violations[:10]:
        print(f"    {v}")
    return 1 if res.violations or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
