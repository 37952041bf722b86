"""Servers and URLs that must not fool or hang hwprofile (the one HTTP module,
hwprofile/telemetry/http.py): one URL rule for every flag that takes a server, no redirect followed,
a deadline on the whole exchange (a trickling server passes every per-read timeout), a cap on the
body (an endless one), and option values that are not finite numbers refused."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import inproc
import pytest
from test_daemon_telemetry import vllm_text

from hwprofile.telemetry import http as hw_http
from hwprofile.telemetry.scrape import Scraper, scrape


class Server:
    """A loopback HTTP server whose every answer is ``mode``: ok (vLLM /metrics), redirect (to
    ``target``), trickle (one byte every 0.2 s, forever), endless (a body without end)."""

    def __init__(self, mode: str, target: str = "") -> None:
        self.mode, self.target = mode, target
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", outer.target + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if outer.mode == "trickle":
                    try:
                        for b in b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" * 1000:
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        return
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                if outer.mode == "endless":
                    self.end_headers()
                    try:
                        chunk = b"x" * 65536
                        while True:
                            self.wfile.write(chunk)
                    except OSError:
                        return
                body = vllm_text().encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *a: object) -> None:
                pass

        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            block_on_close = False

        self.httpd = S(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[object]:
    made: list[Server] = []

    def make(mode: str, target: str = "") -> Server:
        made.append(Server(mode, target))
        return made[-1]

    yield make
    for s in made:
        s.close()


def hw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return inproc.hwprofile(args, os.environ, timeout=timeout)


# -- one URL rule ------------------------------------------------------------------------------------

BAD_URLS = {
    "file": ("file:///etc/passwd", "a file:// URL"),
    "ftp": ("ftp://127.0.0.1/", "a ftp:// URL"),
    "no-scheme": ("127.0.0.1:8000", "no scheme"),
    "no-host": ("http:///metrics", "no host"),
    "credentials": ("http://admin:hunter2@127.0.0.1:8000", "credentials in a URL are not used"),
    "query": ("http://127.0.0.1:8000/?x=1", "no query"),
}
COMMANDS = {
    "watch": ["watch", "--once", "--url"],
    "plan": ["plan", "--advice-from"],
    "bench": ["bench", "--url"],
    "verify": ["verify", "--baseline-url", "http://127.0.0.1:1", "--url"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(BAD_URLS))
def test_every_flag_that_takes_a_server_refuses_what_is_not_one(command: str, case: str) -> None:
    url, why = BAD_URLS[case]
    r = hw(*COMMANDS[command], url)
    flag = COMMANDS[command][-1]
    assert r.returncode == 2 and f"argument {flag}:" in r.stderr and why in r.stderr, r.stderr
    assert "hunter2" not in r.stderr + r.stdout  # a password is never printed


def test_a_redirect_is_an_answer_not_a_place_to_go(server) -> None:
    real = server("ok")
    hop = server("redirect", real.url)
    assert scrape("a", real.url, 0.0).status == "ok"
    r = scrape("a", hop.url, 0.0)
    assert r.status == "unreachable" and "HTTP 302" in (r.error or ""), r  # not the other server's metrics
    assert hw_http.get(hop.url + "/health") == (302, b"")
    out = hw("watch", "--once", "--json", "--interval", "0.1", "--url", hop.url)
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["instances"][0]["status"] == "unreachable", line
    assert out.returncode == 1 and "is unreachable" in out.stderr, out.stderr


def test_watch_once_on_a_dead_url_fails_and_says_why() -> None:
    """A one-shot look at a server that is not there is a failure (exit 1), not a report that exits 0."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        r = hw("watch", "--once", "--interval", "0.1", "--url", url)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert f"{url} is unreachable" in r.stderr and "is vLLM running at that URL?" in r.stderr, r.stderr


# -- every wait has a deadline, every body a cap --------------------------------------------------------


def test_a_trickling_server_is_timed_out_as_a_whole(server) -> None:
    slow = server("trickle")
    t0 = time.monotonic()
    r = Scraper(timeout=0.5)("a", slow.url, 0.0)
    took = time.monotonic() - t0
    assert r.status == "unreachable" and "within 0.5 s" in (r.error or ""), r
    # one byte every 0.2 s, forever, never trips a per-read timeout: only the deadline ends it (the
    # bound is 20 x the deadline, so that a loaded machine's scheduling cannot fail it; forever would)
    assert took < 10, took
    t0 = time.monotonic()
    assert hw_http.get(slow.url + "/health", timeout=0.5) is None
    with pytest.raises(TimeoutError):
        hw_http.post_json(slow.url + "/v1/completions", {"prompt": "x"}, timeout=0.5)
    assert time.monotonic() - t0 < 20  # two deadlines of 0.5 s; without them, forever


def test_an_endless_body_is_capped_not_read_into_memory(server) -> None:
    endless = server("endless")
    r = scrape("a", endless.url, 0.0, timeout=10)
    assert r.status == "error" and "more than" in (r.error or ""), r
    with pytest.raises(hw_http.TooLarge):
        hw_http.request(endless.url + "/v1/models", cap=1 << 20, timeout=10)


# -- option values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, flag",
    [
        (["watch", "--once", "--url", "http://127.0.0.1:1", "--draft-cost", "-1"], "--draft-cost"),
        (["watch", "--once", "--url", "http://127.0.0.1:1", "--draft-cost", "nan"], "--draft-cost"),
        (["watch", "--once", "--url", "http://127.0.0.1:1", "--interval", "inf"], "--interval"),
        (["daemon", "--watch-quiet", "nan"], "--watch-quiet"),
        (["verify", "--limit", "0"], "--limit"),
        (["bench", "--rounds", "-3"], "--rounds"),
    ],
    ids=[
        "draft-cost-negative",
        "draft-cost-nan",
        "interval-inf",
        "watch-quiet-nan",
        "limit-0",
        "rounds-negative",
    ],
)
def test_option_values_that_are_not_finite_numbers_in_range(args: list[str], flag: str) -> None:
    r = hw(*args)
    assert r.returncode == 2 and f"argument {flag}:" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-3"])
def test_counters_that_are_not_counts_make_the_scrape_an_error(value: str) -> None:
    """A server exporting NaN, infinite or negative counters gives no figures at all: before, `watch
    --json` printed NaN (not JSON) and k advice from all-NaN counters was applied to a plan."""
    from hwprofile.telemetry.metrics import MetricsError, parse

    text = vllm_text(draft_tokens=5.0)
    bad = "\n".join(
        ln.rsplit(" ", 1)[0] + f" {value}" if ln.startswith("vllm:spec_decode_num_draft_tokens_total") else ln
        for ln in text.splitlines()
    )
    assert "vllm:spec_decode_num_draft_tokens_total" in text
    with pytest.raises(MetricsError, match="not a count"):
        parse(bad)


def test_one_hung_server_does_not_hold_the_others_or_the_tick(server) -> None:
    """A /metrics trickling one byte every 0.2 s held a whole daemon tick for 30 s (no WATCHDOG=1:
    systemd killed the daemon). Scrapes run at once, each with its own deadline, off the loop."""
    from hwprofile.telemetry.scrape import ScrapePool

    slows, fast = [server("trickle") for _ in range(8)], server("ok")
    pool = ScrapePool(timeout=1.0)
    try:
        for tick in range(2):
            urls = {f"slow{i}": s.url for i, s in enumerate(slows)} | {"fast": fast.url, "also": fast.url}
            t0 = time.monotonic()
            got = pool.collect(urls, float(tick))
            took = time.monotonic() - t0
            # one deadline for all of them (about 1 s), not one after another (8 s or more): the bound
            # between the two leaves a loaded machine 6x the normal time
            assert took < 6, took
            assert got["fast"].status == "ok" and got["also"].status == "ok"
            assert all(got[f"slow{i}"].status == "unreachable" for i in range(8)), got
    finally:
        pool.close()


def test_a_deferred_action_is_logged_once_not_at_every_tick(caplog) -> None:
    from test_overrides import _plan, _Sampler, _Sup

    from hwprofile.daemon.loop import Daemon
    from hwprofile.daemon.watcher import Report

    plan = _plan({"a": 64})
    d = Daemon(
        plan, lambda sets: plan, _Sup(["a"]), _Sampler(), plan.watch, plan.degrade, Path("/nonexistent")
    )
    note = "a: degrade to step 1 deferred: 6 actions in the last hour (watch.max_actions_per_hour 6)"
    d.watcher.tick = lambda now, gpus, scrapes, act=True, **_: Report(now, (), (), (), (note,))  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="hwprofile"):
        for _ in range(20):
            d.tick()
    assert sum(note in r.getMessage() for r in caplog.records) == 1
