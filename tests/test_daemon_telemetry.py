"""Telemetry for the daemon: NVML through the detection chokepoint with kept handles (the fake
libnvidia-ml re-reads its state when the file changes, so a GPU can be heated mid-run), vLLM's
/metrics text as vLLM's own prometheus_client writes it, and hwprofile's exporter."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.request

import pytest

from hwprofile.config.settings import Watch
from hwprofile.daemon.exporter import NAMES, HwprofileCollector, Published
from hwprofile.daemon.watcher import InstanceSpec, Watcher
from hwprofile.host.sampler import GpuSampler
from hwprofile.telemetry import metrics as vllm_metrics
from hwprofile.telemetry.scrape import scrape


def _touch_later(path):
    """Make sure the next write changes the file's stamp (mtime granularity)."""
    time.sleep(0.01)


def test_sampler_keeps_handles_and_sees_a_gpu_heat_up_mid_run(fake_host) -> None:
    host = fake_host("a800-pcie-4x-2numa")
    sampler = GpuSampler()
    try:
        first = sampler.sample(0.0)
        assert [r.index for r in first] == [0, 1, 2, 3]
        assert all(r.status == "ok" and r.temperature_c is not None for r in first)
        assert first[0].slowdown_c is not None and first[0].sm_clock_max_mhz
        handles = dict(sampler.handles)
        _touch_later(host.state)
        host.set_state(**{"dev2.temperature": 87, "dev2.clocks_event_reasons": 0x20, "dev2.sm_clock": 1080})
        second = sampler.sample(1.0)
        assert sampler.handles == handles  # no new detection, same handles
        g2 = second[2]
        assert g2.temperature_c == 87 and g2.sm_clock_mhz == 1080 and g2.reasons == ("sw_thermal_slowdown",)
        _touch_later(host.state)
        host.set_state(**{"dev1.lost": 1})
        third = sampler.sample(2.0)
        assert third[1].status == "lost" and third[0].status == "ok"
        assert sampler.sample(3.0)[1].status == "lost"  # stays lost, reported, no exception
    finally:
        sampler.close()


def test_sampler_margin_where_the_driver_reports_it(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    host.set_state(**{"dev0.margin_temperature": 9})
    sampler = GpuSampler()
    try:
        (r,) = sampler.sample(0.0)
        assert r.margin_c == 9 and r.headroom_c == 9
    finally:
        sampler.close()
    fake_host("a100-80g-pcie-1x")
    sampler = GpuSampler()
    try:
        (r,) = sampler.sample(0.0)
        assert r.margin_c is None and r.headroom_c == r.slowdown_c - r.temperature_c
        assert 0 in sampler._no_margin  # asked once, not every tick
    finally:
        sampler.close()


def test_sampler_without_nvml_is_data(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HWPROFILE_NVML_LIBRARY", str(tmp_path / "missing.so"))
    sampler = GpuSampler()
    assert sampler.error and "cannot be loaded" in sampler.error
    assert sampler.sample(0.0) == ()


def vllm_text(
    spec: bool = True, drafts=0.0, draft_tokens=0.0, accepted=0.0, per_pos=(), running=3.0, ttft=()
):
    """A /metrics body written by prometheus_client the way vLLM V1 registers its families
    (labels model_name and engine; counters exported with _total and _created)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "r", labels, registry=reg).labels("m", "0").set(running)
    Gauge("vllm:num_requests_waiting", "w", labels, registry=reg).labels("m", "0").set(1)
    Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=reg).labels("m", "0").set(0.25)
    Counter("vllm:generation_tokens", "g", labels, registry=reg).labels("m", "0").inc(1000)
    Counter("vllm:num_preemptions", "p", labels, registry=reg).labels("m", "0").inc(2)
    h = Histogram("vllm:time_to_first_token_seconds", "t", labels, buckets=(0.05, 0.1, 0.5), registry=reg)
    child = h.labels("m", "0")  # vLLM V1 creates its per-engine children at start
    for v in ttft:
        child.observe(v)
    if spec:
        Counter("vllm:spec_decode_num_drafts", "d", labels, registry=reg).labels("m", "0").inc(drafts)
        Counter("vllm:spec_decode_num_draft_tokens", "d", labels, registry=reg).labels("m", "0").inc(
            draft_tokens
        )
        Counter("vllm:spec_decode_num_accepted_tokens", "a", labels, registry=reg).labels("m", "0").inc(
            accepted
        )
        pp = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "p", [*labels, "position"], registry=reg)
        for i, v in enumerate(per_pos):
            pp.labels("m", "0", str(i)).inc(v)
    return generate_latest(reg).decode()


def test_parse_reads_totals_only_and_keeps_positions_apart() -> None:
    m = vllm_metrics.parse(vllm_text(drafts=10, draft_tokens=50, accepted=30, per_pos=(9, 8, 6, 4, 3)))
    assert m.engine == "v1" and m.spec_decode and m.running == 3 and m.kv_usage == 0.25
    assert m.counters[vllm_metrics.DRAFTS] == 10 and m.counters[vllm_metrics.ACCEPTED] == 30
    assert m.counters[vllm_metrics.PER_POS + "{position=2}"] == 6
    assert not any(k.endswith("_created") for k in m.counters)
    none = vllm_metrics.parse("# no vllm here\nprocess_cpu_seconds_total 3.0\n")
    assert none.metrics_disabled
    with pytest.raises(vllm_metrics.MetricsError):
        vllm_metrics.parse('vllm:num_requests_running{model_name="m" 3\n')


class _Server:
    def __init__(self) -> None:
        self.body = ""
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = outer.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def test_scrape_ignores_proxies_and_reports_unreachable_and_disabled(monkeypatch) -> None:
    srv = _Server()
    try:
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a dead proxy: must not be used
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        srv.body = vllm_text()
        r = scrape("a", srv.url, 0.0)
        assert r.status == "ok" and r.metrics and r.metrics.running == 3
        srv.body = "process_cpu_seconds_total 1\n"
        r = scrape("a", srv.url, 1.0)
        assert r.status == "metrics_disabled" and "--disable-log-stats" in r.error
    finally:
        srv.close()
    r = scrape("a", srv.url, 2.0)
    assert r.status == "unreachable"


def test_watcher_window_figures_and_exporter_names() -> None:
    srv = _Server()
    try:
        w = Watcher(
            Watch(min_draft_tokens=10),
            [InstanceSpec("vllm-gpu0", srv.url, (0,), num_speculative_tokens=5, max_num_seqs=64)],
        )
        srv.body = vllm_text(drafts=0, per_pos=(0, 0, 0, 0, 0), ttft=())  # V1 creates them at 0
        w.tick(0.0, (), {"vllm-gpu0": scrape("vllm-gpu0", srv.url, 0.0)})
        srv.body = vllm_text(
            drafts=100,
            draft_tokens=500,
            accepted=300,
            per_pos=(90, 80, 60, 40, 30),
            ttft=[0.03] * 90 + [0.3] * 10,
        )
        rep = w.tick(10.0, (), {"vllm-gpu0": scrape("vllm-gpu0", srv.url, 10.0)})
    finally:
        srv.close()
    (i,) = rep.instances
    assert i.acceptance_rate == pytest.approx(0.6) and i.mean_acceptance_length == pytest.approx(4.0)
    assert i.acceptance_per_position == pytest.approx((0.9, 0.8, 0.6, 0.4, 0.3))
    assert i.ttft_p50_s == pytest.approx(0.05 * 50 / 90) and 0.1 < i.ttft_p99_s <= 0.5
    assert i.warning and "below the profile's band" in i.warning and i.advice is not None
    pub = Published()
    pub.report = rep
    pub.instance_states = {"vllm-gpu0": "ready"}
    pub.restarts = {"vllm-gpu0": 1}
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(HwprofileCollector(pub))
    text = generate_latest(reg).decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert {
        "hwprofile_instance_restarts_total",
        "hwprofile_actions_total",
        "hwprofile_instance_state",
    } <= exported
    assert exported <= set(NAMES) | {n + "_created" for n in NAMES}
    assert all(n.startswith("hwprofile_") for n in exported)


def test_exporter_serves_on_loopback_only() -> None:
    from hwprofile.daemon.exporter import serve

    server, thread = serve(Published(), 0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        body = (
            urllib.request.build_opener(urllib.request.ProxyHandler({}))
            .open(f"http://127.0.0.1:{port}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert "hwprofile_ticks_total 0.0" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_failing_temperature_reads_through_the_real_nvml_path_hold_then_turn_unknown(fake_host) -> None:
    """GPU 2 at 86 °C with one temperature read in three failing (NVML_ERROR_UNKNOWN from the fake
    libnvidia-ml, the other calls answering): degraded as with steady reads; then every read failing
    while degraded: held, then unknown, never recovered (the issue's `GPU 2 hot -> ok` at 86 °C)."""
    host = fake_host("a800-pcie-4x-2numa")
    base = host.state.read_text() + "dev2.temperature=86\n"
    s = Watch(hot_c=82, dwell_s=3, recover_s=10, unknown_s=15)

    def tick(w: Watcher, sampler: GpuSampler, now: float, fail: bool):
        host.state.write_text(base + ("dev2.err.nvmlDeviceGetTemperature=999\n" if fail else ""))
        _touch_later(host.state)
        return w.tick(now, sampler.sample(now), {})

    steady = 3.0  # steady reads: hot pending at 0, held for dwell_s
    for pattern in ((False,), (False, False, True)):
        sampler = GpuSampler()
        try:
            w = Watcher(s, [InstanceSpec("vllm-gpu2", "http://127.0.0.1:1", (2,))])
            acts = []
            for t in range(12):
                rep = tick(w, sampler, float(t), pattern[t % len(pattern)])
                if pattern[t % len(pattern)]:
                    g2 = rep.gpus[2].reading
                    assert g2.temperature_c is None and g2.status == "partial"
                acts += [(t, a.kind) for a in rep.actions]
            assert [k for _, k in acts] == ["degrade"] and acts[0][0] <= steady + 1, (pattern, acts)
            # every read failing from now on: no recover, ever; unknown after watch.unknown_s
            for t in range(12, 60):
                rep = tick(w, sampler, float(t), True)
                assert [a.kind for a in rep.actions] == [], t
            g2 = rep.to_json()["gpus"][2]
            assert g2["thermal_state"] == "unknown" and "last known hot" in g2["reason"]
            assert rep.to_json()["instances"][0]["thermal_state"] == "unknown"
        finally:
            sampler.close()
