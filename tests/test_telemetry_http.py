"""One kept-alive connection per server for what is asked again and again (``/metrics`` every tick,
``/health`` every few seconds): reused while the server keeps it (HTTP/1.1, as vLLM's uvicorn does), a
connection per question when it does not (HTTP/1.0), a fresh try when a kept one was closed meanwhile,
and every exchange still cut at its deadline."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hwprofile.telemetry import http as h
from hwprofile.telemetry.scrape import Scraper

BODY = b"vllm:num_requests_running 1\n"


class Counting:
    """A server that counts the connections it accepted. ``protocol``: HTTP/1.1 keeps them, HTTP/1.0
    closes each after its answer; ``drop_silently``: closes after each answer without saying so (a
    keep-alive timeout that ran out between two questions); ``/slow`` trickles a byte every 50 ms."""

    def __init__(self, protocol: str, drop_silently: bool = False) -> None:
        self.connections = 0
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = protocol

            def setup(self) -> None:
                with outer.lock:
                    outer.connections += 1
                super().setup()

            def do_GET(self) -> None:
                if self.path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    for _ in range(200):
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.05)
                    return
                data = BODY if self.path == "/metrics" else b""
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if drop_silently:
                    self.close_connection = True

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def keeps() -> Iterator[Counting]:
    srv = Counting("HTTP/1.1")
    yield srv
    srv.close()


def test_a_server_that_keeps_connections_is_asked_on_one(keeps: Counting) -> None:
    client = h.Client(keeps.url, timeout=5.0)
    try:
        for _ in range(10):
            assert client.get("/health") == (200, b"")
    finally:
        client.close()
    assert client.connects == 1 and keeps.connections == 1
    scraper = Scraper(timeout=5.0)
    try:
        readings = [scraper("a", keeps.url, float(i)) for i in range(10)]
    finally:
        scraper.close()
    assert [r.status for r in readings] == ["ok"] * 10, readings[0].error
    assert readings[-1].metrics is not None and readings[-1].metrics.running == 1
    assert keeps.connections == 2  # the scraper's own one, kept over its ten scrapes


def test_an_http_1_0_server_gets_a_connection_per_question() -> None:
    srv = Counting("HTTP/1.0")
    client = h.Client(srv.url, timeout=5.0)
    try:
        for _ in range(5):
            assert client.get("/health") == (200, b"")
        scraper = Scraper(timeout=5.0)
        try:
            assert [scraper("a", srv.url, 0.0).status for _ in range(3)] == ["ok"] * 3
        finally:
            scraper.close()
    finally:
        client.close()
        srv.close()
    assert client.connects == 5 and srv.connections == 8


def test_a_kept_connection_closed_meanwhile_gets_one_fresh_try() -> None:
    """The server keeps saying HTTP/1.1 and closes after each answer anyway: every next question finds
    the kept connection dead and is answered on a fresh one, never reported as a failure."""
    srv = Counting("HTTP/1.1", drop_silently=True)
    client = h.Client(srv.url, timeout=5.0)
    try:
        for _ in range(4):
            assert client.get("/health") == (200, b"")
            time.sleep(0.05)  # the server's close arrives before the next question
    finally:
        client.close()
        srv.close()
    assert client.connects == 4 and srv.connections == 4


def test_a_dead_server_is_no_answer_after_one_try() -> None:
    srv = Counting("HTTP/1.1")
    url = srv.url
    srv.close()
    client = h.Client(url, timeout=2.0)
    assert client.get("/health") is None
    assert client.connects == 1  # a new connection that fails is not tried again
    assert Scraper(timeout=2.0)("a", url, 0.0).status == "unreachable"


def test_a_kept_connection_still_has_each_exchanges_deadline(keeps: Counting) -> None:
    """A trickle on the kept connection is cut at its deadline, not tried again, and the next question
    is answered on a new connection."""
    client = h.Client(keeps.url, timeout=5.0)
    try:
        assert client.get("/health") == (200, b"")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            client.request("/slow", timeout=0.5)
        assert time.monotonic() - t0 < 5.0  # the trickle lasts 10 s
        assert client.connects == 1
        assert client.get("/health") == (200, b"")
        assert client.connects == 2
        with pytest.raises(h.TooLarge):
            client.request("/metrics", cap=len(BODY) - 1)
        assert client.get("/health") == (200, b"") and client.connects == 3
    finally:
        client.close()
    assert h.DEADLINES._live == set()


def test_the_fake_vllm_keeps_connections_as_uvicorn_does(tmp_path) -> None:
    """The fake vLLM of the tests and of benchmarks/bench_daemon.py answers HTTP/1.1 and keeps the
    connection (as vLLM's uvicorn does), so the bench measures the kept path: scrapes and probes on one."""
    import os
    import signal
    import subprocess
    import sys

    from vllmtools import FAKE_VLLM, fake_model, free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKEVLLM_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE_VLLM),
            "serve",
            str(fake_model(tmp_path / "model")),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--fake-ready-delay",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    client, scraper = h.Client(url, timeout=5.0), Scraper(timeout=5.0)
    try:
        end = time.monotonic() + 60
        while client.get("/health") != (200, b"") and time.monotonic() < end:
            client.close()  # not up yet: start again from nothing
            client.connects = 0
            time.sleep(0.05)
        for _ in range(5):
            assert client.get("/health") == (200, b"")
        assert client.connects == 1
        assert [scraper("a", url, float(i)).status for i in range(5)] == ["ok"] * 5
        assert [c.connects for c in scraper._clients.values()] == [1]
    finally:
        client.close()
        scraper.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
