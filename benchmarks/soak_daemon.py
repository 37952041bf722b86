"""The churn soak: the daemon's real loop for ``--minutes`` of simulated time (one tick per simulated
second, run as fast as the loop goes) with faults injected, checked at every tick (tests/soak.py).

    python benchmarks/soak_daemon.py [--minutes 20] [--seed 1]
    nice -n 10 python benchmarks/soak_daemon.py --real [--minutes 20] [--flip-s 40 --kill-s 180 --reload-s 120]

GPU 0 flips across hot every 40 s with a third of its temperature reads failing; one instance is killed
every 3 min (its supervisor brings it back); an override is rewritten every 2 min (a reload); the runtime
directory is deleted every 10 min (a --user unit at logout). Printed: the invariants (no recover on a tick
whose reading was not made, one degrade and one recover per hot episode, never two instances restarted at
once, no instance lost, one owner of the runtime directory), the loop's own CPU per tick, and this
process's RSS and open descriptors at the start and the end (flat: nothing the daemon keeps grows).
``tests/test_daemon_cost.py`` runs a compressed version in the suite.

``--real``: the same churn in real time with real processes: ``hwprofile daemon`` on a fake 4-GPU host
(the fake libnvidia-ml), 2 instances of tests/fakevllm.py; GPU 0's temperature flips across hot every
``--flip-s`` (watch.recover_s=20: a recover fits in each cool phase), one vLLM is SIGKILLed every
``--kill-s`` (the instances in turn, the pid from state.json), an override (overrides.d/10-site.yaml)
is rewritten every ``--reload-s``. Printed: degrades and recovers per hot episode of the instance on
GPU 0, the supervisor's restarts, instances lost (seen failed; must be none), the daemon's RSS, open
descriptors and CPU at the start and the end, its exit code and the ERROR lines of its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real", action="store_true", help="real processes in real time (see above)")
    ap.add_argument("--flip-s", type=float, default=40.0)
    ap.add_argument("--kill-s", type=float, default=180.0)
    ap.add_argument("--reload-s", type=float, default=120.0)
    args = ap.parse_args()
    if args.real:
        return real_soak(args)
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


# -- the real-time soak: real processes, real time ----------------------------------------------------
REAL_HOST = "a800-pcie-4x-2numa"  # 4 GPUs: 2 instances of TP 2, the first on GPU 0 (the one that heats)
HOT_C, COOL_C = 86, 60


class RealRun:
    """The daemon (``hwprofile daemon`` on the fake host through the fake libnvidia-ml, tests/fakevllm.py
    as vLLM) in a process of its own, with what the soak reads of it: daemon.json and state.json."""

    def __init__(self, tmp: Path) -> None:
        from bench_daemon import CONFIG, FAKE, free_port  # the bench's model and fake vLLM
        from fakehost import build, compile_fake_nvml

        self.tmp = tmp
        lib = compile_fake_nvml(tmp / "lib")
        self.host = build(REAL_HOST, tmp / "host")
        self.host.set_state(**{"dev0.temperature": COOL_C})
        model = tmp / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(CONFIG))
        (model / "model.safetensors").write_bytes(b"\0" * 4096)
        shim = tmp / "vllm"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
        shim.chmod(0o755)
        self.etc = tmp / "etc"
        (self.etc / "overrides.d").mkdir(parents=True)
        self.runtime = tmp / "rt"
        env = {
            **self.host.env(lib.parent),
            "HWPROFILE_CONFIG_ROOT": str(self.etc),
            "HWPROFILE_RUNTIME_DIR": str(self.runtime),
            "FAKEVLLM_READY_DELAY": "1",
        }
        sets = [
            "layout.tensor_parallel_size=2",
            "server.shutdown_timeout=2",
            f"server.port={free_port(2)}",
            f"server.vllm_command={shim}",
            f"logs.dir={tmp / 'logs'}",
            "watch.metrics_port=0",
            f"watch.hot_c={HOT_C - 4}",
            "watch.recover_s=20",  # a recover inside each 40 s cool phase (the default is 300 s)
            "watch.max_actions_per_hour=120",
        ]
        self.err = tmp / "daemon.err"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "daemon",
                "--model",
                str(model),
                *[f"--set={s}" for s in sets],
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.err.open("wb"),
            start_new_session=True,
        )

    def doc(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.runtime / name).read_text())
        except (OSError, ValueError):
            return {}

    def instances(self) -> list[dict[str, Any]]:
        return list(self.doc("state.json").get("instances") or [])

    def ready(self) -> bool:
        insts = self.instances()
        return len(insts) == 2 and all(i.get("state") == "ready" for i in insts)

    def rss_fds(self) -> tuple[float, int]:
        return proc_rss_mb(self.proc.pid), len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@dataclass
class RealTally:
    """What the real-time soak saw: each finished hot episode's (degrades, recovers) of the instance on
    GPU 0, the kills it made, the reloads it caused, the actions by kind and outcome, instance losses."""

    episodes: list[tuple[int, int]] = field(default_factory=list)
    current: list[int] = field(default_factory=lambda: [0, 0])
    kills: int = 0
    rewrites: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    lost: dict[str, float] = field(default_factory=dict)  # instance -> seconds seen failed
    restarts: dict[str, int] = field(default_factory=dict)
    replacements: dict[str, int] = field(default_factory=dict)
    memory: list[tuple[float, int]] = field(default_factory=list)  # the daemon's RSS (MB), fds: each minute

    def actions(self, doc: dict[str, Any], watched: str) -> None:
        for a in doc.get("actions") or []:
            key = (a.get("at"), a.get("kind"), a.get("instance"), a.get("outcome"))
            if key in self.seen:
                continue
            self.seen.add(key)
            self.outcomes[f"{a.get('kind')} {a.get('outcome')}"] += 1
            if a.get("instance") == watched and a.get("outcome") == "started":
                if a.get("kind") == "degrade":
                    self.current[0] += 1
                elif a.get("kind") == "recover":
                    self.current[1] += 1

    def states(self, insts: list[dict[str, Any]], dt: float) -> None:
        for i in insts:
            name = i.get("name", "?")
            self.restarts[name] = max(self.restarts.get(name, 0), int(i.get("restarts") or 0))
            self.replacements[name] = max(self.replacements.get(name, 0), int(i.get("replacements") or 0))
            if i.get("state") == "failed":
                self.lost[name] = self.lost.get(name, 0.0) + dt


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def churn(run: RealRun, tally: RealTally, elapsed: float, last: float, args: argparse.Namespace) -> None:
    """The faults due between ``last`` and ``elapsed`` (seconds since the soak began)."""

    def due(every: float) -> bool:
        return int(elapsed // every) > int(last // every)

    if due(args.flip_s):
        hot = int(elapsed // args.flip_s) % 2 == 1
        run.host.set_state(**{"dev0.temperature": HOT_C if hot else COOL_C})
        if hot:  # a new hot episode begins: the last one (hot, then cool) is finished
            if int(elapsed // args.flip_s) > 1:
                tally.episodes.append((tally.current[0], tally.current[1]))
            tally.current = [0, 0]
    if due(args.kill_s):
        insts = run.instances()
        victim = insts[tally.kills % len(insts)] if insts else None
        if victim and victim.get("pid"):
            with contextlib.suppress(OSError):
                os.kill(int(victim["pid"]), signal.SIGKILL)
                tally.kills += 1
    if due(args.reload_s):
        tally.rewrites += 1
        site = run.etc / "overrides.d" / "10-site.yaml"
        site.write_text(f"watch:\n  warm_c: {74 + tally.rewrites % 2}\n")


def real_soak(args: argparse.Namespace) -> int:
    """``--real``: the daemon and its instances as processes, for ``--minutes`` of wall time."""
    with tempfile.TemporaryDirectory(prefix="hwpsr-", dir="/tmp") as tmp_s:
        run = RealRun(Path(tmp_s))
        try:
            end = time.monotonic() + 120
            while not run.ready():
                if time.monotonic() > end or run.proc.poll() is not None:
                    print("the daemon's instances did not become ready; its stderr ends:")
                    print("\n".join(run.err.read_text(errors="replace").splitlines()[-20:]))
                    return 1
                time.sleep(0.5)
            watched = next(i["name"] for i in run.instances() if 0 in (i.get("gpus") or []))
            time.sleep(10)  # past start-up
            rss0, fds0 = run.rss_fds()
            cpu0 = bench_cpu_seconds(run.proc.pid)
            tally = RealTally()
            t0 = last = time.monotonic()
            while (now := time.monotonic()) - t0 < args.minutes * 60 and run.proc.poll() is None:
                churn(run, tally, now - t0, last - t0, args)
                if int((now - t0) // 60) >= len(tally.memory):
                    tally.memory.append(run.rss_fds())
                tally.actions(run.doc("daemon.json"), watched)
                tally.states(run.instances(), now - last)
                last = now
                time.sleep(0.5)
            wall = time.monotonic() - t0
            rss1, fds1 = run.rss_fds() if run.proc.poll() is None else (float("nan"), -1)
            cpu = bench_cpu_seconds(run.proc.pid) - cpu0 if run.proc.poll() is None else float("nan")
        finally:
            code = run.stop()
        errors = [ln for ln in run.err.read_text(errors="replace").splitlines() if "ERROR" in ln]
    report_real(args, tally, wall, (rss0, rss1), (fds0, fds1), cpu, code, errors, watched)
    bad = [e for e in tally.episodes if e != (1, 1)]
    return 1 if bad or tally.lost or code != 0 else 0


def bench_cpu_seconds(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")


def report_real(
    args: argparse.Namespace,
    tally: RealTally,
    wall: float,
    rss: tuple[float, float],
    fds: tuple[int, int],
    cpu: float,
    code: int,
    errors: list[str],
    watched: str,
) -> None:
    print(
        f"real-time churn soak: {wall / 60:.1f} min of wall time, host {REAL_HOST}, 2 instances (fake vLLM), "
        "no systemd --user here (the daemon ran as a plain process)"
    )
    print(
        f"  injected: GPU 0 {HOT_C}/{COOL_C} °C flipped every {args.flip_s:g} s, {tally.kills} SIGKILLs "
        f"(every {args.kill_s:g} s), {tally.rewrites} override rewrites (every {args.reload_s:g} s)"
    )
    good = sum(1 for e in tally.episodes if e == (1, 1))
    print(
        f"  {watched} (on GPU 0): one degrade + one recover in {good} of {len(tally.episodes)} finished "
        f"episodes; per episode (degrades, recovers): {tally.episodes}"
    )
    print(f"  actions seen (kind outcome: count): {dict(sorted(tally.outcomes.items()))}")
    print(f"  crash restarts by the supervisor: {tally.restarts}; planned replacements: {tally.replacements}")
    print(f"  instances lost (seen failed, seconds): {tally.lost or 'none'}")
    print(
        f"  daemon RSS {rss[0]:.1f} -> {rss[1]:.1f} MB, open descriptors {fds[0]} -> {fds[1]}, "
        f"CPU {100 * cpu / wall:.2f} % of one core over the soak"
    )
    print(
        "  daemon RSS each minute (MB): "
        + " ".join(f"{r:.1f}" for r, _ in tally.memory)
        + "; open descriptors: "
        + " ".join(str(f) for _, f in tally.memory)
    )
    print(f"  daemon exit on SIGTERM: {code}; ERROR lines in its log: {len(errors)}")
    for e in errors[:10]:
        print(f"    {e[:200]}")


if __name__ == "__main__":
    raise SystemExit(main())
