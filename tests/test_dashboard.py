"""The Grafana dashboard's queries name only metrics that really exist: hwprofile's exporter's, and
vLLM's own as vLLM 0.32 exports them; every panel follows the host selector and keeps hosts apart.
tests/test_prometheus.py runs every query against a real Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hwprofile.daemon.exporter import NAMES

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "hwprofile.json"

# vLLM's /metrics names the dashboard and monitoring/rules use, as vLLM 0.32 exports them (counters
# with _total, a histogram's _bucket): shared/facts/vllm-metrics.md, table 1; tests/fakevllm.py
# serves all of them.
VLLM_NAMES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    }
)
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, grouping labels, strings, label
    matchers, ranges and Grafana variables left out)."""
    bare = re.sub(r"\"[^\"]*\"", "", expr)  # strings first: they may hold braces
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
        if not bare[m.end() :].lstrip().startswith("(") and m.group().lower() not in KEYWORDS:
            names.add(m.group())  # not a function's name, not a keyword
    return names


def queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_metric_names_reads_promql() -> None:
    expr = 'max by (host, gpu) (rate(vllm:num_preemptions_total{host=~"$host", a="{x}"}[5m])) or up * 2'
    assert metric_names(expr) == {"vllm:num_preemptions_total", "up"}


def test_every_query_names_an_exported_metric() -> None:
    exprs = queries()
    assert len(exprs) >= 10
    known = set(NAMES) | VLLM_NAMES | {"up"}
    used: set[str] = set()
    for e in exprs:
        names = metric_names(e)
        assert names, e
        unknown = names - known
        assert not unknown, f"{e}: {unknown} is exported by nobody (exporter.NAMES, VLLM_NAMES)"
        used |= names
    # the metrics a reader needs first are on the board
    first = {
        "hwprofile_gpu_temperature_celsius",
        "hwprofile_gpu_thermal_state",
        "hwprofile_instance_degrade_level",
    }
    assert first <= used
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:kv_cache_usage_perc", "up"} <= used


def test_every_query_follows_the_host_selector_and_keeps_hosts_apart() -> None:
    """Many hosts on one board: each selector filters on $host, and each aggregation keeps the host
    and the target (`instance`) apart, so that two hosts' GPU 0 never add up."""
    dash = json.loads(DASHBOARD.read_text())
    (host,) = [v for v in dash["templating"]["list"] if v["name"] == "host"]
    assert host["includeAll"] and host["allValue"] == ".*"  # "All" also matches series without `host`
    for e in queries():
        selectors = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{([^}]*)\}", e)
        assert selectors and all('host=~"$host"' in s for s in selectors), e
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", e):
            assert {"host", "instance"} <= {g.strip() for g in grouping.split(",")}, e


def test_thermal_state_query_unions_the_states() -> None:
    """`a{state="warm"} + b{state="hot"}` matches no series (the state labels differ); `or` does."""
    (e,) = [q for q in queries() if "hwprofile_gpu_thermal_state" in q]
    assert " + " not in e and e.count(" or ") == 3, e
