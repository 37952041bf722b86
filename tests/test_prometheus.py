"""monitoring/ for real: promtool checks the shipped scrape config and alerting rules and runs the
rules' unit tests; a real Prometheus scrapes two ``hwprofile daemon`` exporters on two fake GPU hosts
of different classes and their (fake) vLLM servers' /metrics (TTFT from their own histograms, which
the test's completions fill), evaluates every query of dashboards/hwprofile.json and the p99-TTFT
alert's quantile, and puts the hot-card alert in pending when a card heats up.

Prometheus and promtool come from Debian's ``prometheus`` package (.ci/run installs it). Without
them the tests fail in CI (CI=true) and are skipped elsewhere, saying what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakehost import build
from system import need
from test_dashboard import DASHBOARD, VLLM_NAMES, metric_names
from vllmtools import fake_model, fake_vllm_shim, free_port, free_ports

from hwprofile.config.run_sections import Bench, Watch
from hwprofile.daemon.exporter import NAMES

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
CONFIG = MONITORING / "prometheus.yml"
RULES = MONITORING / "rules" / "hwprofile.rules.yml"
RULES_TEST = MONITORING / "rules" / "hwprofile.rules.test.yml"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def tool(name: str) -> str:
    return need(name)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


# -- fast: promtool and the files themselves --------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout, r.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    r = promtool("test", "rules", str(RULES_TEST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_promtool_checks_the_scrape_config() -> None:
    r = promtool("check", "config", str(CONFIG))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "is valid prometheus config file syntax" in r.stdout, r.stdout
    doc = yaml.safe_load(CONFIG.read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {"hwprofile", "vllm"}
    for job in jobs.values():  # the targets come from files, and the shipped examples parse
        (sd,) = job["file_sd_configs"]
        files = [p for pattern in sd["files"] for p in sorted(MONITORING.glob(pattern))]
        assert files, sd
        for f in files:
            groups = yaml.safe_load(f.read_text())
            assert groups and all(g["targets"] and g["labels"]["host"] for g in groups), f


def test_every_rule_is_an_alert_with_a_for_annotations_and_real_metric_names() -> None:
    known = set(NAMES) | VLLM_NAMES | {"up"}
    for r in rules():
        assert r.get("alert") and r.get("for"), r
        assert r["annotations"].get("summary") and r["annotations"].get("description"), r["alert"]
        assert r["labels"]["severity"] in {"info", "warning", "critical"}, r["alert"]
        names = metric_names(r["expr"])
        assert names and names <= known, f"{r['alert']}: {names - known} is exported by nobody"


def test_every_alert_is_unit_tested_both_ways() -> None:
    """Each alert of the rules is checked in the unit tests firing and, at another time, not firing."""
    doc = yaml.safe_load(RULES_TEST.read_text())
    checks = [c for t in doc["tests"] for c in t.get("alert_rule_test", [])]
    for name in (r["alert"] for r in rules()):
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name} never expected to fire"
        assert any(not c["exp_alerts"] for c in mine), f"{name} never expected to stay quiet"
        assert all(a.get("exp_annotations") for c in mine for a in c["exp_alerts"]), name


def test_the_rules_thresholds_are_hwprofiles_defaults() -> None:
    """The rules say they use hwprofile's defaults; they do (a changed default shows here)."""
    by = {r["alert"]: r["expr"] for r in rules()}
    w, b = Watch(), Bench()
    assert f"< {w.acceptance_low}" in by["VllmSpecDecodeAcceptanceLow"]
    assert f"> {w.acceptance_high}" in by["VllmSpecDecodeAcceptanceHigh"]
    for name in ("VllmSpecDecodeAcceptanceLow", "VllmSpecDecodeAcceptanceHigh"):
        assert f">= {w.min_draft_tokens}" in by[name]
    assert f"> {b.ttft_p99_target_ms / 1000:.3f}" in by["VllmTtftP99High"]


# -- slow: a real Prometheus over two daemons -------------------------------------------------------

GRAFANA_VARIABLES = {
    # $host: the dashboard's "All" value (allValue ".*"), every host.
    "$host": ".*",
    # $__rate_interval: Grafana's is max($__interval + scrape interval, 4 x scrape interval), 4 s at
    # this test's 1 s scrape interval; 15 s leaves a loaded CI machine's late scrapes two samples.
    "$__rate_interval": "15s",
}


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable this test does not replace: {expr}"
    return expr


def get_json(url: str) -> Any:
    try:
        with NO_PROXY.open(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 400:  # Prometheus refuses the query itself (bad_data): no use waiting
            raise AssertionError(f"{url}: {e.read().decode(errors='replace')}") from None
        raise


def wait_for(pred, what: str, timeout: float = 120.0, log: Path | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError):
            got = pred()
            if got:
                return got
        time.sleep(0.25)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


def end(proc: subprocess.Popen[Any]) -> None:
    """End a process this test started, by its PID (TERM, then KILL)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Host:
    """One fake GPU host with its `hwprofile daemon` (exporter on 127.0.0.1) and fake vLLM servers."""

    def __init__(self, name: str, cls: str, tmp: Path, lib: Path, instances: int, sets: list[str]) -> None:
        self.name, self.dir = name, tmp / name
        self.fake = build(cls, self.dir / "host")
        model = fake_model(self.dir / "model")
        shim = fake_vllm_shim(self.dir / "vllm")
        self.runtime = Path(f"/tmp/hwpp-{os.getpid()}-{tmp.name[-6:]}-{name}")  # short: socket paths
        (self.dir / "etc").mkdir()
        self.env = {
            **{k: v for k, v in self.fake.env(lib).items() if not k.startswith("FAKEVLLM_")},
            "HWPROFILE_CONFIG_ROOT": str(self.dir / "etc"),
            "HWPROFILE_RUNTIME_DIR": str(self.runtime),
            "HWPROFILE_STATE_DIR": str(self.dir / "state"),
            "FAKEVLLM_READY_DELAY": "0.2",
        }
        self.port, self.metrics_port = free_ports(instances), free_port()
        self.vllm = [f"127.0.0.1:{self.port + i}" for i in range(instances)]
        self.exporter = f"127.0.0.1:{self.metrics_port}"
        self.model = str(model)
        self.argv = [
            sys.executable,
            "-m",
            "hwprofile",
            "daemon",
            "--model",
            str(model),
            *(
                "--set=" + s
                for s in [
                    "server.shutdown_timeout=1",
                    f"server.port={self.port}",
                    f"server.vllm_command={shim}",
                    f"logs.dir={self.dir / 'logs'}",
                    "watch.interval=0.5",
                    "watch.dwell_s=0.6",
                    "watch.recover_s=600",
                    f"watch.metrics_port={self.metrics_port}",
                    *sets,
                ]
            ),
        ]
        self.log = self.dir / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.code: int | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc is not None:
            end(self.proc)
            self.code = self.proc.returncode
        shutil.rmtree(self.runtime, ignore_errors=True)

    def leftovers(self) -> str:
        """Processes of this host's fake vLLM still running (its model path is this test's own)."""
        return subprocess.run(["pgrep", "-f", f"serve {self.model}"], capture_output=True, text=True).stdout


class Traffic:
    """Completions sent to every vLLM server until stopped, so that counters and the TTFT histograms
    move between scrapes: a few requests a second to each server, dozens within a 15 s rate window."""

    def __init__(self, hosts: list[Host]) -> None:
        self.targets = [(f"http://{t}/v1/completions", h.model) for h in hosts for t in h.vllm]
        self.stop_ = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop_.is_set():
            for url, model in self.targets:
                body = json.dumps(
                    {"model": model, "prompt": "the cat sat on the mat", "max_tokens": 8}
                ).encode()
                req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                with contextlib.suppress(OSError, ValueError):
                    NO_PROXY.open(req, timeout=10).read()
                    self.sent += 1
            self.stop_.wait(0.2)

    def stop(self) -> None:
        self.stop_.set()
        self.thread.join(30)


def prometheus_config(tmp: Path, hosts: list[Host]) -> Path:
    """The shipped monitoring/prometheus.yml with this test's targets files, 1 s scrapes and rule
    evaluations, and the shipped rules (unchanged, from their own path)."""
    doc = yaml.safe_load(CONFIG.read_text())
    doc["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    doc["rule_files"] = [str(RULES)]
    targets = tmp / "targets"
    targets.mkdir()
    groups = {
        "hwprofile": [{"targets": [h.exporter], "labels": {"host": h.name}} for h in hosts],
        "vllm": [{"targets": h.vllm, "labels": {"host": h.name}} for h in hosts],
    }
    for job in doc["scrape_configs"]:
        name = job["job_name"]
        (targets / f"{name}.yml").write_text(yaml.safe_dump(groups[name]))
        job["file_sd_configs"] = [{"files": [str(targets / f"{name}*.yml")], "refresh_interval": "1s"}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = promtool("check", "config", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    return path


@pytest.mark.slow(minutes=0.5)
def test_a_real_prometheus_scrapes_two_hosts_answers_the_dashboard_and_alerts(
    tmp_path, fake_nvml_dir
) -> None:
    prometheus = tool("prometheus")
    tool("promtool")
    hosts = [
        # an A800 PCIe host, one server per NUMA pair (two instances), no speculation
        Host(
            "a800",
            "a800-pcie-4x-2numa",
            tmp_path,
            fake_nvml_dir,
            2,
            ["layout.shape=servers", "speculative.method=none", "layout.tensor_parallel_size=2"],
        ),
        # an RTX 4090 host, one instance with ngram speculation (k=2: the fake accepts one of two)
        Host(
            "rtx4090",
            "rtx4090-1x",
            tmp_path,
            fake_nvml_dir,
            1,
            [
                "speculative.method=ngram",
                "speculative.num_speculative_tokens=2",
                "watch.window_s=5",
                "watch.min_draft_tokens=1",
            ],
        ),
    ]
    # an idle card says so (NVML's gpu_idle clock-event reason), as a real idle GPU does: the panel
    # of active reasons has a series without any card being throttled
    for h in hosts:
        h.fake.set_state(**{"dev0.clocks_event_reasons": 0x1})
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    plog = tmp_path / "prometheus.log"
    prom: subprocess.Popen[bytes] | None = None
    traffic: Traffic | None = None
    try:
        for h in hosts:
            h.start()
        config = prometheus_config(tmp_path, hosts)
        started = time.monotonic()
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=plog.open("wb"),
            start_new_session=True,
        )
        expected = {h.exporter for h in hosts} | {t for h in hosts for t in h.vllm}

        def all_up() -> bool:
            active = get_json(api + "/targets?state=active")["data"]["activeTargets"]
            seen = {t["labels"]["instance"]: t["health"] for t in active}
            return set(seen) == expected and all(v == "up" for v in seen.values())

        wait_for(all_up, f"Prometheus to see all {len(expected)} targets up", log=plog)
        targets_up_s = time.monotonic() - started

        def query(q: str) -> list[dict[str, Any]]:
            url = api + "/query?" + urllib.parse.urlencode({"query": q})
            doc = get_json(url)
            assert doc["status"] == "success", doc
            return doc["data"]["result"]

        ready = 'hwprofile_instance_state{state="ready"} == 1'
        wait_for(lambda: len(query(ready)) == 3, "the three vLLM instances ready", log=hosts[0].log)
        traffic = Traffic(hosts)

        # every query of the dashboard, as Grafana would send it with "All" hosts
        answers: dict[str, list[dict[str, Any]]] = {}
        exprs = dashboard_queries()
        exporters = {h.exporter for h in hosts}
        servers = {t for h in hosts for t in h.vllm}

        def hosts_wanted(expr: str) -> set[str]:
            """Both hosts on every query but speculation's (only the RTX host speculates)."""
            return {"rtx4090"} if "spec" in expr else {"a800", "rtx4090"}

        def measured(result: list[dict[str, Any]]) -> bool:
            """A quantile per vLLM server, from requests observed in the rate window (no requests
            there: NaN)."""
            instances = {s["metric"].get("instance") for s in result}
            return instances == servers and all(0 < float(s["value"][1]) < 1e9 for s in result)

        def complete(expr: str) -> bool:
            result = answers.get(expr) or []
            if {s["metric"].get("host") for s in result} != hosts_wanted(expr):
                return False
            # TTFT from the fake vLLM servers' own histograms, which Traffic's completions fill
            if expr.startswith("histogram_quantile("):
                return measured(result)
            # hwprofile's own series: both exporters, by the target's `instance` label
            if metric_names(expr) <= set(NAMES) and "spec" not in expr:
                return {s["metric"].get("instance") for s in result} == exporters
            return True

        def every_query_answered() -> bool:
            for expr in exprs:
                if not complete(expr):
                    answers[expr] = query(grafana_to_promql(expr))
            return all(complete(e) for e in exprs)

        try:
            wait_for(every_query_answered, "every dashboard query answered for its hosts", timeout=90)
        except AssertionError:
            missing = "\n".join(
                f"{grafana_to_promql(e)}: {sorted({str(s['metric'].get('host')) for s in answers.get(e) or []})}"
                for e in exprs
                if not complete(e)
            )
            raise AssertionError(f"dashboard queries without their hosts' series:\n{missing}") from None
        queries_s = time.monotonic() - started
        # hwprofile's own `instance` label (the vLLM instance's name) is kept as exported_instance
        named = {(s["metric"]["host"], s["metric"]["exported_instance"]) for s in query(ready)}
        assert named == {("a800", "vllm-gpu0-1"), ("a800", "vllm-gpu2-3"), ("rtx4090", "vllm-gpu0")}, named

        # the shipped rules evaluate on these series without an error
        groups = get_json(api + "/rules")["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        assert len(evaluated) == len(rules()) and all(r["health"] == "ok" for r in evaluated), evaluated
        # and VllmTtftP99High's p99 has a value per vLLM server (the threshold left out)
        (ttft_rule,) = [r for r in rules() if r["alert"] == "VllmTtftP99High"]
        p99 = re.sub(r"\s*>\s*[0-9.]+\s*$", "", ttft_rule["expr"])
        assert p99 != ttft_rule["expr"], ttft_rule["expr"]
        p99_result = query(p99)
        assert measured(p99_result), p99_result
        assert {s["metric"]["host"] for s in p99_result} == {"a800", "rtx4090"}, p99_result

        # GPU 2 of the A800 host past its profile's hot_c (82 °C): HwprofileGpuHot goes pending
        heated = time.monotonic()
        hosts[0].fake.set_state(**{"dev2.temperature": 84})

        def hot_alert() -> list[dict[str, Any]]:
            alerts = get_json(api + "/alerts")["data"]["alerts"]
            return [
                a
                for a in alerts
                if a["labels"]["alertname"] == "HwprofileGpuHot"
                and a["labels"].get("host") == "a800"
                and a["state"] in ("pending", "firing")
            ]

        (alert,) = wait_for(hot_alert, "HwprofileGpuHot pending", log=hosts[0].log)
        pending_s = time.monotonic() - heated
        assert alert["labels"]["gpu"] == "2" and alert["labels"]["instance"] == hosts[0].exporter, alert
        assert alert["labels"]["severity"] == "warning" and "GPU 2" in alert["annotations"]["summary"]
        thermal = next(e for e in answers if "hwprofile_gpu_thermal_state" in e)
        now = query(grafana_to_promql(thermal))
        levels = {(s["metric"]["host"], s["metric"]["gpu"]): float(s["value"][1]) for s in now}
        assert levels[("a800", "2")] == 2 and levels[("rtx4090", "0")] == 0, levels
        # no GPU alert on the RTX host, whose card stayed cool
        alerts = get_json(api + "/alerts")["data"]["alerts"]
        cool = [
            a for a in alerts if a["labels"].get("host") == "rtx4090" and "Gpu" in a["labels"]["alertname"]
        ]
        assert not cool, cool
        print(
            f"\nPrometheus saw {len(expected)} targets up {targets_up_s:.1f} s after its start; all "
            f"{len(answers)} dashboard queries answered for their hosts after {queries_s:.1f} s; "
            f"HwprofileGpuHot {alert['state']} {pending_s:.1f} s after the card heated; "
            f"{traffic.sent} completions sent"
        )
    finally:
        if traffic is not None:
            traffic.stop()
        if prom is not None:
            end(prom)
        for h in hosts:
            h.stop()
    for h in hosts:  # each daemon stopped cleanly, its vLLM servers with it
        assert h.code == 0, h.log.read_text()[-3000:]
        assert not h.leftovers(), h.leftovers()


def test_grafana_variables_are_all_replaced() -> None:
    """Every dashboard query turns into plain PromQL with the test's replacements (no `$` left)."""
    for expr in dashboard_queries():
        q = grafana_to_promql(expr)
        assert "$" not in q and re.search(r"[a-z]", q)
