"""The cost of watching: a /metrics that hangs never delays a thermal reading nor holds tick after tick;
and the churn soak, compressed with an injected clock (thousands of simulated ticks with faults injected),
asserting the invariants of months unattended."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Any

from hwprofile.host.sampler import GpuReading


class _Gated:
    """A /metrics that answers only once ``gate`` is set; ``asked`` is set when a request arrived."""

    def __init__(self) -> None:
        self.gate, self.asked = threading.Event(), threading.Event()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.set()
                outer.gate.wait(120)
                data = b"vllm:num_requests_running 0\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_hung_metrics_endpoint_never_delays_the_gpu_readings_nor_holds_every_tick() -> None:
    from test_overrides import _plan, _Sup

    from hwprofile.daemon.loop import Daemon
    from hwprofile.telemetry.scrape import ScrapePool

    srv = _Gated()
    sampled: list[float] = []
    first_sample = threading.Event()

    class Sampler:
        def sample(self, now: float) -> list[GpuReading]:
            sampled.append(now)
            first_sample.set()
            return [GpuReading(0, now, temperature_c=60.0, slowdown_c=95.0)]

    plan = _plan({"a": 64})
    # the scrape's own deadline far away: only the gate ends it
    pool = ScrapePool(timeout=120.0, wait_s=120.0)
    t = [0.0]
    d = Daemon(
        plan,
        lambda sets: plan,
        _Sup(["a"]),
        Sampler(),
        plan.watch,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: t[0],
        collect=lambda targets, now: pool.collect({"a": srv.url}, now),
    )
    try:
        tick = threading.Thread(target=d.tick)
        tick.start()
        assert srv.asked.wait(60), "the scrape never reached the server"
        # the scrape hangs: the GPUs were read already, at the tick's own time
        assert first_sample.is_set() and sampled == [0.0]
        pool.wait_s = 0.0  # the first tick gives up on it now (an unreachable reading)
        srv.gate.set()
        tick.join(60)
        assert not tick.is_alive()
        # the server hangs again; a scrape already known to hang is not waited for at the next ticks
        srv.gate.clear()
        srv.asked.clear()
        t[0] = 1.0
        pool.wait_s = 0.0
        d.tick()  # starts a new scrape (the last one ended) that hangs
        assert srv.asked.wait(60)
        pool.wait_s = 120.0  # were the hung scrape waited for, the next ticks would block until the gate
        for i in range(2, 5):
            t[0] = float(i)
            done = threading.Event()
            th = threading.Thread(target=lambda ev=done: (d.tick(), ev.set()))
            th.start()
            assert done.wait(60), "a tick waited for a scrape already known to hang"
            th.join()
            assert d.report is not None and d.report.instances[0].status == "unreachable"
        assert sampled == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        srv.close()
        pool.close()


def test_compressed_churn_soak_keeps_the_invariants(tmp_path: Path) -> None:
    """40 minutes of churn in simulated seconds (2400 ticks of the real loop on an injected clock): GPU 0
    flips across hot every 40 s with a third of its reads failing, an instance killed every 3 min, an
    override rewritten every 2 min, the runtime directory deleted every 10 min. No recover on a tick whose
    reading was not made, exactly one degrade and one recover per hot episode, never two instances restarted
    at once, no instance lost, one owner of the runtime directory, and nothing the daemon keeps grows."""
    from soak import soak

    res = soak(tmp_path / "rt", 2400, seed=7)
    assert res.violations == [], res.violations[:5]
    assert res.ticks == 2400 and res.crashes >= 10 and res.reloads == 19 and res.runtime_deleted == 3
    assert res.episodes == 30 and len(res.per_episode) == 29
    assert all(ep == (1, 1) for ep in res.per_episode), res.per_episode
    # the last episode is still hot at the end: its recover is not due yet
    assert res.actions["degrade"] == 30 and res.actions["recover"] == 29 and res.actions["restart"] == 0
    assert res.max_in_flight == 1
    assert res.fds[1] <= res.fds[0] + 2, res.fds
    assert res.bounded["history"] <= 50 and res.bounded["errors"] <= 50 and res.bounded["queue"] == 0
    assert res.bounded["window_samples"] <= 12
