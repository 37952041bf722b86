"""The cost of watching: a /metrics that hangs never delays a thermal reading nor holds tick after tick;
and the churn soak, compressed with an injected clock (thousands of simulated ticks with faults injected),
asserting the invariants of months unattended."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Any

import pytest

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
                data = b"vllm:num_requests_running 1\n"  # busy: scraped at every tick (an idle one is not)
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
        # on a loaded machine the tick may reach its wait only once wait_s is 0: it gave up, and the pool
        # still holds the scrape it started; let that end and be collected (the gate is open), so that the
        # next tick starts a scrape of its own
        if "a" in pool._running:
            pool._running["a"][0].result(60)
            pool.collect({"a": srv.url}, 0.5)
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


# -- fewer scrapes and parses: what an idle server costs ------------------------------------------------


def _counting_daemon(running: dict[str, float], stall_s: float = 120.0):  # -> (Daemon, scrapes, clock)
    """A daemon over instances a (and b) whose /metrics say ``running[name]`` requests; every scrape it
    makes is counted, each with its tick's time."""
    import dataclasses

    from test_overrides import _plan, _Sampler, _Sup

    from hwprofile.daemon.loop import Daemon
    from hwprofile.telemetry.metrics import GENERATION, RUNNING, WAITING, VllmMetrics
    from hwprofile.telemetry.scrape import InstanceReading

    plan = _plan(dict.fromkeys(running, 64))
    settings = dataclasses.replace(plan.watch, stall_s=stall_s)
    scrapes: dict[str, list[float]] = {n: [] for n in running}
    t = [0.0]

    def collect(targets: dict[str, str], now: float) -> dict[str, InstanceReading]:
        out = {}
        for name, url in targets.items():
            scrapes[name].append(now)
            m = VllmMetrics(
                "v1", {RUNNING: running[name], WAITING: 0.0}, {GENERATION: 10.0 * len(scrapes[name])}
            )
            out[name] = InstanceReading(name, url, now, "ok", m)
        return out

    d = Daemon(
        plan,
        lambda sets: plan,
        _Sup(list(running)),
        _Sampler(),
        settings,
        plan.degrade,
        Path("/nonexistent"),
        clock=lambda: t[0],
        collect=collect,
        rss_reader=lambda inst: None,
    )
    return d, scrapes, t


def test_an_idle_instance_is_scraped_every_few_seconds_a_busy_one_at_every_tick(caplog) -> None:
    """Idle (nothing running or waiting at its last scrape): its reading stands for IDLE_SCRAPE_S, so a
    request that arrives is seen at most that late; busy, or queued for a restart: scraped at every tick.
    The reading that stands is the instance's last one, and its figures are not computed again."""
    from hwprofile.daemon.actions import Recover
    from hwprofile.daemon.loop import IDLE_SCRAPE_S

    running = {"a": 0.0, "b": 3.0}
    d, scrapes, t = _counting_daemon(running)
    assert d.idle_scrape_s() == IDLE_SCRAPE_S
    for tick in range(21):
        t[0] = float(tick)
        d.tick()
    assert scrapes["b"] == [float(i) for i in range(21)]
    assert scrapes["a"] == [0.0, 5.0, 10.0, 15.0, 20.0]
    rep = {i.name: i for i in d.report.instances} if d.report else {}
    assert rep["a"].status == "ok" and rep["a"].running == 0.0
    # work arrives at a between two scrapes: seen at its next one, never later than IDLE_SCRAPE_S
    running["a"] = 2.0
    t[0] = 21.0
    d.tick()
    assert scrapes["a"][-1] == 20.0 and {i.name: i for i in d.report.instances}["a"].running == 0.0
    for tick in range(22, 26):
        t[0] = float(tick)
        d.tick()
    assert scrapes["a"][-1] == 25.0 and {i.name: i for i in d.report.instances}["a"].running == 2.0
    t[0] = 26.0
    d.tick()
    assert scrapes["a"][-1] == 26.0  # busy now: at every tick
    # idle again, but queued for a restart: scraped at every tick while the loop acts on it
    running["a"] = 0.0
    d.queue.append(Recover("a", "test", (0,), 0))
    for tick in range(27, 30):
        t[0] = float(tick)
        d.tick()
    assert scrapes["a"][-3:] == [27.0, 28.0, 29.0]


def test_the_idle_scrape_staleness_is_bounded_by_the_stall_time() -> None:
    """A quarter of watch.stall_s when that is shorter: a hung engine is never judged later for it."""
    d, scrapes, t = _counting_daemon({"a": 0.0}, stall_s=8.0)
    assert d.idle_scrape_s() == 2.0
    for tick in range(7):
        t[0] = float(tick)
        d.tick()
    assert scrapes["a"] == [0.0, 2.0, 4.0, 6.0]


def test_an_unchanged_metrics_body_is_not_parsed_again() -> None:
    """Only the kept lines count: a body whose other series moved (process CPU, a _created time) is the
    same figures; one whose read series moved is parsed again."""
    from hwprofile.telemetry import metrics

    body = (
        "# HELP process_cpu_seconds_total x\n# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total {cpu}\n"
        'vllm:num_requests_running{{engine="0"}} 0.0\n'
        'vllm:generation_tokens_total{{engine="0"}} {gen}\n'
        'vllm:generation_tokens_created{{engine="0"}} 1.7e9\n'
    )
    calls: list[str] = []
    real = metrics.parse_kept

    def counted(text: str, seen: Any = None) -> metrics.VllmMetrics:
        calls.append(text)
        return real(text, seen)

    parser = metrics.Parser()
    try:
        metrics.parse_kept = counted  # type: ignore[assignment]
        first = parser(body.format(cpu=1.0, gen=5.0))
        again = parser(body.format(cpu=2.5, gen=5.0))
        moved = parser(body.format(cpu=2.5, gen=6.0))
    finally:
        metrics.parse_kept = real  # type: ignore[assignment]
    assert again is first and len(calls) == 2
    assert moved.counters[metrics.GENERATION] == 6.0 and first.counters[metrics.GENERATION] == 5.0
    assert moved == real(metrics.kept(body.format(cpu=0, gen=6.0)))


def test_a_busy_servers_unchanged_lines_are_not_parsed_again(monkeypatch) -> None:
    """A busy server's counters move at every scrape, most of its lines do not: only the lines that
    changed go through prometheus-client's parser, and the figures are the whole body's."""
    import prometheus_client.parser as pp

    from hwprofile.telemetry import metrics

    body = (
        'vllm:num_requests_running{{engine="0"}} 1.0\n'
        'vllm:num_requests_waiting{{engine="0"}} 0.0\n'
        'vllm:prompt_tokens_total{{engine="0"}} 40.0\n'
        'vllm:generation_tokens_total{{engine="0"}} {gen}\n'
    )
    parsed: list[str] = []
    real = pp.text_string_to_metric_families

    def counted(text: str) -> Any:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(pp, "text_string_to_metric_families", counted)
    parser = metrics.Parser()
    parser(body.format(gen=5.0))
    assert len(parsed) == 4
    moved = parser(body.format(gen=6.0))
    assert parsed[4:] == ['vllm:generation_tokens_total{engine="0"} 6.0\n']
    monkeypatch.setattr(pp, "text_string_to_metric_families", real)
    assert moved == metrics.parse(body.format(gen=6.0))
    assert moved.counters[metrics.GENERATION] == 6.0 and moved.running == 1.0


def test_http_deadlines_are_kept_by_one_thread_not_one_per_request() -> None:
    """Many exchanges, one deadline thread; a server that trickles is still cut at its deadline."""
    import time

    from hwprofile.telemetry import http as h

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(100):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(0.05)
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        started: list[str] = []
        real_start = threading.Thread.start
        me = threading.current_thread()

        def counting_start(self: threading.Thread) -> None:
            if threading.current_thread() is me:  # the client's threads, not the server's
                started.append(self.name)
            real_start(self)

        threading.Thread.start = counting_start  # type: ignore[method-assign]
        try:
            for _ in range(20):
                assert h.get(url + "/fast", timeout=5.0) == (200, b"ok")
        finally:
            threading.Thread.start = real_start  # type: ignore[method-assign]
        assert [n for n in started if n != "http-deadlines"] == [], started
        assert sum(t.name == "http-deadlines" for t in threading.enumerate()) == 1
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            h.request(url + "/slow", timeout=0.5)
        assert time.monotonic() - t0 < 4.0  # cut at its deadline, not after the whole trickle (5 s)
        assert h.DEADLINES._live == set()  # nothing left registered
    finally:
        srv.shutdown()
        srv.server_close()


def test_histogram_buckets_are_parsed_every_few_seconds_counters_at_every_scrape() -> None:
    """A busy server: its gauges and counters are read at every scrape; its bucket lines (most of a
    real body) at most every BUCKETS_EVERY_S, the last ones parsed standing between; the figures then
    are those of a whole parse."""
    from hwprofile.telemetry import metrics

    def body(gen: float, fast: float) -> str:
        edges = ("0.01", "0.1", "1.0", "+Inf")
        counts = (fast, fast + 1, fast + 2, fast + 2)
        return "".join(
            [
                'vllm:num_requests_running{engine="0"} 2.0\n',
                f'vllm:generation_tokens_total{{engine="0"}} {gen}\n',
                *(
                    f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="{e}"}} {c}\n'
                    for e, c in zip(edges, counts, strict=True)
                ),
            ]
        )

    t = [0.0]
    parser = metrics.Parser(clock=lambda: t[0])
    first = parser(body(10.0, 5.0))
    assert first.itl_buckets[0.01] == 5.0
    t[0] = 1.0
    m = parser(body(20.0, 9.0))  # counters new, buckets as parsed at 0 s
    assert m.counters[metrics.GENERATION] == 20.0 and m.itl_buckets == first.itl_buckets
    t[0] = metrics.BUCKETS_EVERY_S
    m = parser(body(30.0, 12.0))  # due: a whole parse
    assert m == metrics.parse(body(30.0, 12.0)) and m.itl_buckets[0.01] == 12.0
    t[0] += 0.5
    m = parser(body(31.0, 12.0))  # buckets unchanged: nothing stale either
    assert m == metrics.parse(body(31.0, 12.0))
