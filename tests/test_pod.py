"""``hwprofile daemon`` as a container's entrypoint: PID 1 of its own PID namespace (``unshare --pid
--fork --mount-proc``, as a container runtime makes one), with the fake NVML host and the fake vLLM.

What a pod needs from it, each shown here: the stopping signal reaches the daemon and drains (PID 1
drops signals it has no handler for), orphans handed to PID 1 are reaped, the exit status is the
daemon's (0 when asked to stop, 1 when vLLM failed for good), vLLM's lines are on stdout for the
cluster's log collection, and a degrade restarts vLLM inside the pod with the metrics port's
``/health`` (the readiness probe) answering 503 *while the old server still serves*, so the Service
routes elsewhere before the drain. The pure parts (readiness, liveness, exit statuses) first."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest
from fakehost import build
from vllmtools import fake_model, fake_vllm_shim, free_port
from waiting import wait_for

from hwprofile.daemon.exporter import Published, app, liveness, readiness
from hwprofile.runtime.init import exit_status

UNSHARE = shutil.which("unshare")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- the pure parts ------------------------------------------------------------------------------


def test_readiness_follows_what_the_loop_published() -> None:
    p = Published()
    assert readiness(p) == (False, "starting")
    p.unready = None
    assert readiness(p) == (True, "ready")
    p.unready = "degrade of vllm-gpu2-3: its drain begins in 4 s"
    assert readiness(p) == (False, "degrade of vllm-gpu2-3: its drain begins in 4 s")


def test_liveness_is_the_loop_ticking() -> None:
    p = Published()
    assert liveness(p, 1000.0)[0]  # no tick yet: the startup probe's business
    p.last_tick_at, p.interval = 1000.0, 1.0
    assert liveness(p, 1029.0)[0]
    ok, why = liveness(p, 1031.0)
    assert not ok and "over 30 s" in why
    p.interval = 5.0  # ten intervals when they are longer
    assert liveness(p, 1049.0)[0] and not liveness(p, 1051.0)[0]


def call(application, path: str) -> tuple[str, bytes]:
    env: dict = {"PATH_INFO": path}
    setup_testing_defaults(env)
    got: dict = {}
    body = b"".join(application(env, lambda status, headers: got.update(status=status)))
    return got["status"], body


def test_the_metrics_port_answers_probes_and_scrapes() -> None:
    p = Published()
    now = [100.0]
    a = app(p, clock=lambda: now[0])
    assert call(a, "/health") == ("503 Service Unavailable", b"starting\n")
    p.unready, p.last_tick_at = None, 100.0
    assert call(a, "/health") == ("200 OK", b"ready\n")
    assert call(a, "/livez")[0] == "200 OK"
    now[0] = 200.0
    assert call(a, "/livez")[0].startswith("503")
    status, body = call(a, "/metrics")
    assert status.startswith("200") and b"hwprofile_ticks_total" in body


@pytest.mark.parametrize(
    ("status", "code"), [(0, 0), (1 << 8, 1), (2 << 8, 2), (signal.SIGKILL, 137), (signal.SIGTERM, 143)]
)
def test_exit_status_is_a_shells(status: int, code: int) -> None:
    assert exit_status(status) == code


# -- PID 1 -------------------------------------------------------------------------------------------

# the shim leaves an orphan each start: a subshell's sleep, handed to PID 1 when the subshell exits
ORPHAN = "( sleep 0.5 & )\n"


@pytest.fixture
def pod(tmp_path, fake_nvml_dir):
    if UNSHARE is None or os.geteuid() != 0:
        pytest.fail(
            "unshare(1) as root is needed for a PID namespace (util-linux; the tests run as root in CI)"
        )
    model = fake_model(tmp_path / "model")
    shim = fake_vllm_shim(tmp_path / "vllm", prelude=ORPHAN)
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    runtime = Path("/tmp") / f"hwpod-{os.getpid()}-{tmp_path.name[-6:]}"
    starts = tmp_path / "starts.jsonl"
    env = {
        **{k: v for k, v in host.env(fake_nvml_dir).items() if not k.startswith("FAKEVLLM_")},
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        "HWPROFILE_RUNTIME_DIR": str(runtime),
        "FAKEVLLM_ARGV_LOG": str(starts),
        "FAKEVLLM_READY_DELAY": "0.2",
    }
    (tmp_path / "etc").mkdir()
    port, metrics = free_port(), free_port()
    sets = [
        "engine.max_num_seqs=256",
        "speculative.method=none",
        "server.shutdown_timeout=1",
        f"server.port={port}",
        f"server.vllm_command={shim}",
        f"logs.dir={tmp_path / 'logs'}",
        "layout.shape=servers",
        "layout.tensor_parallel_size=2",  # the operator's two NUMA pairs (a profile's layout may give way)
        "watch.interval=0.2",
        "watch.dwell_s=0.6",
        f"watch.metrics_port={metrics}",
        "watch.unready_s=4",
        "logs.stdout=true",
    ]
    procs: list[subprocess.Popen] = []

    def start(*extra: str) -> subprocess.Popen:
        out = open(tmp_path / "stdout", "w")  # noqa: SIM115 (the child holds it)
        proc = subprocess.Popen(
            # --kill-child: however the test ends, unshare's death ends the namespace (SIGKILL to PID 1)
            [
                UNSHARE,
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                sys.executable,
                "-m",
                "hwprofile",
                "daemon",
                "--model",
                str(model),
                *[f"--set={s}" for s in (*sets, *extra)],
            ],
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        out.close()
        procs.append(proc)
        return proc

    yield {"start": start, "host": host, "port": port, "metrics": metrics, "starts": starts, "tmp": tmp_path}
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # unshare --kill-child SIGKILLs PID 1: the kernel ends its whole namespace
            proc.wait(30)
    shutil.rmtree(runtime, ignore_errors=True)


def children(pid: int) -> list[int]:
    """Every child of ``pid`` (host numbering): each thread's own, as /proc lists them per thread."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(out))


def init_of(unshare: subprocess.Popen) -> int | None:
    """The host PID of the namespace's PID 1: unshare's one child."""
    kids = children(unshare.pid)
    return kids[0] if kids else None


def stat(pid: int) -> tuple[str, int] | None:
    """(state, parent PID) of ``pid`` (host numbering)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def zombies_of(pid: int) -> list[int]:
    return [c for c in children(pid) if (s := stat(c)) and s[0] == "Z"]


def get(url: str) -> int | None:
    try:
        with OPENER.open(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def starts_on(path: Path, port: int) -> list[list[str]]:
    if not path.exists():
        return []
    argvs = [json.loads(line)["argv"] for line in path.read_text().splitlines()]
    return [a for a in argvs if a[a.index("--port") + 1] == str(port)]


def test_as_pid_1_it_reaps_forwards_the_stop_and_degrades_inside_the_pod(pod) -> None:
    proc = pod["start"]()
    health = f"http://127.0.0.1:{pod['metrics']}/health"
    hot_port = pod["port"] + 1  # the instance on GPUs 2-3
    try:
        wait_for(lambda: get(health) == 200, "the pod ready (every instance serves)")
        init = init_of(proc)
        assert init is not None
        # PID 1's one child of its own: the daemon; the others were handed to it (each vLLM's keeper,
        # supervise/tether.py, is forked twice to be init's by design; the shim's sleep)
        (daemon,) = [
            c for c in children(init) if b"hwprofile\0daemon" in Path(f"/proc/{c}/cmdline").read_bytes()
        ]
        assert len(children(daemon)) == 2
        # every start left an orphan that ends (the shim's sleep): handed to PID 1, reaped there
        time.sleep(1.5)
        wait_for(lambda: zombies_of(init) == [], "orphans handed to PID 1 reaped, not left as zombies")
        assert get(f"http://127.0.0.1:{hot_port}/health") == 200
        pod["host"].set_state(**{"dev2.temperature": 84})  # past the A800 profile's hot_c (82 °C)
        # readiness goes false while the old server still serves: the Service stops sending first
        # (one predicate, the start count read last: the 200 is the old server's, not restarted yet)
        wait_for(
            lambda: (
                get(health) == 503
                and get(f"http://127.0.0.1:{hot_port}/health") == 200
                and len(starts_on(pod["starts"], hot_port)) == 1
            ),
            "/health 503 before the drain, the old server still answering",
        )
        wait_for(lambda: len(starts_on(pod["starts"], hot_port)) == 2, "the degraded start inside the pod")
        new = starts_on(pod["starts"], hot_port)[-1]
        assert new[new.index("--max-num-seqs") + 1] == "192"
        wait_for(lambda: get(health) == 200, "ready again")
        assert zombies_of(init) == []  # the old vLLM's keeper too, which ended with it
        # the kubelet's SIGTERM goes to PID 1: forwarded, the daemon drains and the pod exits 0
        os.kill(init, signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err[-3000:]
    assert "PID 1: the daemon runs as PID" in err and "draining and stopping every instance" in err
    out = (pod["tmp"] / "stdout").read_text()
    assert "[vllm-gpu0-1] " in out and "[vllm-gpu2-3] " in out  # vLLM's own lines, for kubectl logs


def test_as_pid_1_it_exits_with_vllms_fate(pod) -> None:
    crashing = fake_vllm_shim(pod["tmp"] / "crashing", prelude="export FAKEVLLM_CRASH_AFTER=0.5\n")
    proc = pod["start"]("supervise.max_restarts=0", f"server.vllm_command={crashing}")
    code = proc.wait(120)
    err = proc.stderr.read() if proc.stderr else ""
    # vLLM died and no restart was left: the daemon ends failed, and so does the pod (1, through PID 1)
    assert code == 1 and "PID 1: the daemon runs as PID" in err and "instances that failed" in err, err[
        -2000:
    ]


# -- the image -----------------------------------------------------------------------------------

CONTAINERFILE = Path(__file__).resolve().parent.parent / "Containerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_image_runs_the_daemon_with_settings_that_plan(tmp_path, fake_nvml_dir) -> None:
    steps = instructions(CONTAINERFILE.read_text())
    (entry,) = [json.loads(a) for w, a in steps if w == "ENTRYPOINT"]  # exec form: hwprofile is PID 1
    assert entry[:2] == ["hwprofile", "daemon"]
    assert steps[-1][0] == "ENTRYPOINT" or "CMD" not in {w for w, _ in steps}  # the model comes as args
    env = dict(kv.split("=", 1) for w, a in steps if w == "ENV" for kv in a.split())
    made = " ".join(a for w, a in steps if w == "RUN")
    for key in ("HF_HOME", "VLLM_CACHE_ROOT", "HWPROFILE_RUNTIME_DIR", "HWPROFILE_STATE_DIR"):
        assert env[key].startswith(("/cache", "/run/hwprofile", "/var/lib/hwprofile")), key
    for d in ("/cache", "/run/hwprofile", "/var/lib/hwprofile"):
        assert "chown 1000:1000" in made and d in made  # writable by the image's user
    assert ("USER", "1000:1000") in steps
    # the entrypoint's settings are valid ones and mean what the comments say: a plan with them
    model = fake_model(tmp_path / "model")
    host = build("rtx4090-1x", tmp_path / "host")
    (tmp_path / "etc").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "plan", "--model", str(model), "--json", *entry[2:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")},
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    inst = plan["instances"][0]
    assert inst["server"]["host"] == "0.0.0.0"
    assert plan["watch"]["metrics_host"] == "0.0.0.0" and plan["watch"]["unready_s"] > 0
    assert plan["logs"]["stdout"] is True
