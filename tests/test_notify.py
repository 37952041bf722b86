"""sd_notify for ``hwprofile daemon``, on an AF_UNIX datagram socket the test creates (a path and an
abstract ``@`` name), spoken by hwprofile itself (the one implementation: no systemd-python). End to
end with the fake vLLM: READY=1
only once both instances answer /health, STATUS= lines, WATCHDOG=1 paced by WATCHDOG_USEC,
RELOADING=1 (MONOTONIC_USEC) then READY=1 on SIGHUP, STOPPING=1 on SIGTERM, and no vLLM child sees
NOTIFY_SOCKET or WATCHDOG_*."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_daemon_fast import daemon_doc, daemon_env, starts_of  # noqa: F401 (fixture)
from waiting import wait_for

from hwprofile.daemon.notify import Notifier, send_datagram


class Listener:
    """A bound SOCK_DGRAM socket; datagrams collected with their arrival time on a thread."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.got: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.got.append((time.monotonic(), fields))

    def having(self, key: str) -> list[tuple[float, dict[str, str]]]:
        return [(t, f) for t, f in list(self.got) if key in f]

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()
        if not self.address.startswith("@"):
            Path(self.address).unlink(missing_ok=True)


@pytest.fixture
def listener():
    made: list[Listener] = []

    def make(abstract: bool = False) -> Listener:
        name = f"hwpn-{os.getpid()}-{len(made)}-{time.monotonic_ns() % 10**6}"
        lis = Listener("@" + name if abstract else f"/tmp/{name}.sock")
        made.append(lis)
        return lis

    yield make
    for lis in made:
        lis.close()


@pytest.mark.parametrize("abstract", [False, True])
def test_builtin_protocol_sends_one_datagram_per_message(listener, abstract) -> None:
    lis = listener(abstract)
    n = Notifier(lis.address)
    assert n.ready("2/2 ready") and n.status("2/2 ready · GPU2 hot 84 °C")
    assert not n.status("2/2 ready · GPU2 hot 84 °C")  # unchanged: not sent again
    assert n.reloading() and n.stopping()
    wait_for(lambda: len(lis.got) == 4, "4 datagrams", 5)
    ready, status, reloading, stopping = (f for _, f in lis.got)
    assert ready["READY"] == "1" and ready["STATUS"] == "2/2 ready" and ready["MAINPID"] == str(os.getpid())
    assert status == {"STATUS": "2/2 ready · GPU2 hot 84 °C"}
    assert reloading["RELOADING"] == "1"
    usec = int(reloading["MONOTONIC_USEC"])
    assert abs(usec - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 10_000_000
    assert stopping["STOPPING"] == "1"


def test_outside_systemd_everything_is_a_no_op() -> None:
    env = {"PATH": "/bin"}
    n = Notifier.from_environ(env)
    assert not n.enabled and not n.ready() and not n.watchdog() and not n.stopping()


def test_a_failed_send_is_logged_not_raised(caplog) -> None:
    n = Notifier("/nonexistent/hwprofile-notify.sock")
    assert n.ready() is False and n.ready() is False
    assert sum("sd_notify" in r.message for r in caplog.records) == 1  # once per kind of failure
    with pytest.raises(OSError):
        send_datagram("relative/path", "READY=1")


def test_watchdog_pacing_and_pid(listener) -> None:
    lis = listener()
    now = [100.0]
    env = {"NOTIFY_SOCKET": lis.address, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    n = Notifier.from_environ(env, clock=lambda: now[0])
    assert env == {}  # read, then removed: no child inherits them
    sent = []
    for _ in range(10):  # ticks 0.25 s apart over 2.5 s: a ping at most every 1 s (half of 2 s)
        sent.append(n.watchdog())
        now[0] += 0.25
    assert sent == [True, False, False, False, True, False, False, False, True, False]
    other = Notifier.from_environ(
        {"NOTIFY_SOCKET": lis.address, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}
    )
    assert other.watchdog_usec is None and not other.watchdog()  # the watchdog is not ours
    wait_for(lambda: len(lis.having("WATCHDOG")) == 3, "3 pings", 5)


def test_os_environ_is_clean_after_reading_the_socket(listener, monkeypatch) -> None:
    lis = listener()
    monkeypatch.setenv("NOTIFY_SOCKET", lis.address)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    n = Notifier.from_environ()
    assert "NOTIFY_SOCKET" not in os.environ and "WATCHDOG_USEC" not in os.environ
    assert n.ready("up") and n.watchdog()
    wait_for(lambda: len(lis.got) == 2, "2 datagrams", 5)
    assert lis.got[0][1]["STATUS"] == "up" and lis.got[1][1] == {"WATCHDOG": "1"}
    out = subprocess.run(  # what a child gets: an environment built from os.environ, without the socket
        [sys.executable, "-c", "import os; print(os.environ.get('NOTIFY_SOCKET'))"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "None"


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("abstract", [True, False], ids=["abstract-socket", "path-socket"])
def test_daemon_notifies_systemd(daemon_env, listener, abstract) -> None:  # noqa: F811
    e = daemon_env
    lis = listener(abstract=abstract)
    env = {**e["env"], "NOTIFY_SOCKET": lis.address, "WATCHDOG_USEC": "600000", "FAKEVLLM_READY_DELAY": "1.5"}
    port = int(next(s.split("=")[1] for s in e["sets"] if s.startswith("server.port=")))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "daemon",
            "--model",
            str(e["model"]),
            *["--set=" + s for s in e["sets"]],
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: lis.having("READY"), "READY=1", 60)
        # READY=1 only now: both instances answer /health (each took 1.5 s to load)
        assert _health(port) and _health(port + 1)
        statuses = [f["STATUS"] for _, f in lis.having("STATUS")]
        assert lis.having("READY")[0][1]["STATUS"].startswith("2/2 ready"), statuses
        assert any(s.startswith("0/2 ready") or s.startswith("1/2 ready") for s in statuses), statuses
        assert lis.having("READY")[0][1]["MAINPID"] == str(proc.pid)
        # WATCHDOG=1 from the daemon's own ticks, again and again. Their pacing (at most every half
        # WATCHDOG_USEC) is test_watchdog_pacing_and_pid's, on an injected clock: here the gaps are the
        # listener thread's receive times, which a loaded machine stretches and bunches (a 1.6 s gap
        # under two CPU hogs), so they judge nothing
        wait_for(lambda: len(lis.having("WATCHDOG")) >= 6, "watchdog pings", 60)
        # no vLLM child sees the socket or the watchdog
        for argv_line in e["starts"].read_text().splitlines():
            pid = json.loads(argv_line)["pid"]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            keys = {kv.split(b"=", 1)[0] for kv in environ if kv}
            assert not keys & {b"NOTIFY_SOCKET", b"WATCHDOG_USEC", b"WATCHDOG_PID"}, keys
        # SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1 (nothing changed: no restart)
        readies = len(lis.having("READY"))
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: len(lis.having("READY")) > readies, "READY=1 after the reload", 20)
        reloading = lis.having("RELOADING")
        assert len(reloading) == 1 and int(reloading[0][1]["MONOTONIC_USEC"]) > 0
        assert reloading[0][0] <= lis.having("READY")[-1][0]
        doc = wait_for(
            lambda: (d := daemon_doc(e["runtime"])).get("reload") and d, "the reload in daemon.json"
        )
        assert doc["reload"]["outcome"] == "applied" and "no instance changed" in doc["reload"]["detail"]
        assert len(starts_of(e["starts"], port)) == 1 and len(starts_of(e["starts"], port + 1)) == 1
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err[-3000:]
    wait_for(lambda: lis.having("STOPPING"), "STOPPING=1", 5)
    # the stop's time comes from the running plan (shutdown_timeout 1 s + stop margin 10 s + 30 s),
    # whatever TimeoutStopSec the unit has
    assert lis.having("STOPPING")[0][1]["EXTEND_TIMEOUT_USEC"] == str(41_000_000)
    assert "sd_notify" not in err, err[-2000:]


# -- the journal ------------------------------------------------------------------------------------
def _decode(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            out[k.decode()] = v.decode()
            i = nl + 1
        else:
            n = int.from_bytes(data[nl + 1 : nl + 9], "little")
            out[line.decode()] = data[nl + 9 : nl + 9 + n].decode()
            i = nl + 9 + n + 1
    return out


def test_journal_handler_sends_fields_over_the_native_protocol(tmp_path) -> None:
    import logging

    from hwprofile.daemon.journal import JournalHandler

    path = f"/tmp/hwpj-{os.getpid()}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        h = JournalHandler(path)
        logger = logging.getLogger("hwprofile.test-journal")
        logger.addHandler(h)
        logger.propagate = False
        logger.error("GPU 2 ok -> hot\nsecond line", extra={"INSTANCE": "vllm-gpu2-3", "GPU_INDEX": 2})
        fields = _decode(sock.recv(65536))
        assert fields["MESSAGE"] == "GPU 2 ok -> hot\nsecond line"  # the binary form keeps the newline
        assert fields["PRIORITY"] == "3" and fields["SYSLOG_IDENTIFIER"] == "hwprofile"
        assert fields["INSTANCE"] == "vllm-gpu2-3" and fields["GPU_INDEX"] == "2"
        assert fields["CODE_FUNC"] == "test_journal_handler_sends_fields_over_the_native_protocol"
        logger.removeHandler(h)
        h.close()
    finally:
        sock.close()
        Path(path).unlink(missing_ok=True)


def test_attach_only_when_stderr_is_the_journal(monkeypatch) -> None:
    import logging

    from hwprofile.daemon import journal

    logger = logging.getLogger("hwprofile.test-attach")
    console = logging.StreamHandler(sys.stderr)
    logger.addHandler(console)
    try:
        assert not journal.attach(logger, {"JOURNAL_STREAM": "1:2"})
        assert console in logger.handlers
        st = os.fstat(sys.stderr.fileno())
        assert journal.attach(logger, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert console not in logger.handlers
        assert any(isinstance(h, journal.JournalHandler) for h in logger.handlers)
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)


def test_status_line_reads_the_loop_state() -> None:
    from types import SimpleNamespace as NS

    from hwprofile.daemon.notify import status_line

    ready = NS(value="ready")
    gpu = lambda i, state, t: NS(to_json=lambda: {"index": i, "thermal_state": state, "temperature_c": t})  # noqa: E731
    d = NS(
        sup=NS(instances=[NS(state=ready), NS(state=ready)]),
        levels={"vllm-gpu0-1": 0, "vllm-gpu2-3": 1},
        watcher=NS(instances={"vllm-gpu0-1": NS(gpus=(0, 1)), "vllm-gpu2-3": NS(gpus=(2, 3))}),
        report=NS(
            gpus=[gpu(0, "ok", 60.0), gpu(2, "hot", 84.2)],
            instances=[NS(acceptance_rate=0.70), NS(acceptance_rate=0.72), NS(acceptance_rate=None)],
        ),
        current=None,
        reload_error=None,
    )
    assert (
        status_line(d) == "2/2 ready (1 degraded: vllm-gpu2-3) · GPU2 hot 84 °C, degraded · acceptance 71 %"
    )
    d.report.gpus[1] = gpu(2, "ok", 70.0)  # cooled, not yet recovered: still said degraded
    assert status_line(d) == "2/2 ready (1 degraded: vllm-gpu2-3) · acceptance 71 %"
    d.report.gpus[1] = gpu(2, "hot", 84.2)
    d.sup.instances[1].state = NS(value="restarting")
    d.current = NS(action=NS(instance="vllm-gpu2-3"))
    d.reload_error = "/etc/hwprofile/overrides.d/a.yaml:2: invalid YAML"
    assert status_line(d) == (
        "1/2 ready (1 degraded: vllm-gpu2-3) · GPU2 hot 84 °C, degraded · acceptance 71 %"
        " · restarting vllm-gpu2-3"
        " · reload failed, last good plan kept: /etc/hwprofile/overrides.d/a.yaml:2: invalid YAML"
    )


def test_a_failed_instance_and_a_failing_health_are_said_where_operators_look() -> None:
    """STATUS=, the metrics port's /health and /metrics: a failed instance with when it is tried again
    (the soak's "active at half capacity" said nothing), a ready one failing /health for how long."""
    import time
    from types import SimpleNamespace as NS

    from prometheus_client import CollectorRegistry, generate_latest

    from hwprofile.daemon.exporter import HwprofileCollector, Published
    from hwprofile.daemon.loop import instance_troubles
    from hwprofile.daemon.notify import status_line

    now = time.time()
    insts = [
        NS(
            name="vllm-gpu0-1",
            state=NS(value="failed"),
            failure={"kind": "unplanned exit"},
            retry_at=now + 240.4,
            health_failing_since=None,
        ),
        NS(
            name="vllm-gpu2-3",
            state=NS(value="ready"),
            failure=None,
            retry_at=None,
            health_failing_since=now - 7,
        ),
    ]
    troubles = instance_troubles(insts, now)
    assert troubles == {
        "vllm-gpu0-1": "vllm-gpu0-1 FAILED (unplanned exit; tried again in 240 s)",
        "vllm-gpu2-3": "vllm-gpu2-3 failing /health for 7 s",
    }
    insts[0].retry_at = None  # retries off, or a configuration error
    assert "not tried again" in instance_troubles(insts, now)["vllm-gpu0-1"]
    d = NS(
        sup=NS(instances=insts),
        levels={},
        watcher=NS(instances={}),
        report=None,
        current=None,
        reload_error=None,
    )
    line = status_line(d)
    assert line.startswith("1/2 ready · vllm-gpu0-1 FAILED (unplanned exit; not tried again")
    assert "vllm-gpu2-3 failing /health for 7 s" in line
    pub = Published()
    pub.instance_states = {"vllm-gpu0-1": "failed", "vllm-gpu2-3": "ready"}
    pub.retry_in = {"vllm-gpu0-1": 240.0}
    pub.health_failing_s = {"vllm-gpu2-3": 7.0}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(HwprofileCollector(pub))
    text = generate_latest(reg).decode()
    assert 'hwprofile_instance_retry_in_seconds{instance="vllm-gpu0-1"} 240.0' in text
    assert 'hwprofile_instance_health_failing_seconds{instance="vllm-gpu2-3"} 7.0' in text
    assert 'hwprofile_instance_health_failing_seconds{instance="vllm-gpu0-1"} 0.0' in text
    assert 'hwprofile_instance_state{instance="vllm-gpu0-1",state="failed"} 1.0' in text
