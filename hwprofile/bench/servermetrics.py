"""What the server itself measured during one benchmark point: the increase of vLLM's own ``/metrics``
histograms between a scrape before and one after (their ``_sum`` and ``_count``: exact means, not
bucket estimates), so a point carries the engine's view beside the client's: time to the first token
and per output token inside the server (no HTTP client, no tokenizer on the client's side), the
prefill and decode time of a request, its queueing, and the engine's steps (``iteration_tokens_total``
counts one sample per step: the steps taken and the tokens per step).

The client (``vllm bench serve``) runs on the same host; on a small, shared CPU its own work and the
load of others fall on its figures; the server's histograms leave the client's part out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the name a point's figure is given -> vLLM's histogram (seconds, or tokens for the steps)
HISTOGRAMS: dict[str, str] = {
    "ttft_ms": "vllm:time_to_first_token_seconds",
    "tpot_ms": "vllm:request_time_per_output_token_seconds",
    "itl_ms": "vllm:inter_token_latency_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
    "decode_ms": "vllm:request_decode_time_seconds",
    "queue_ms": "vllm:request_queue_time_seconds",
    "tokens_per_step": "vllm:iteration_tokens_total",
}
# the name a point's total is given -> a counter: the API server process's own CPU (prometheus_client's
# process collector in the process that serves /metrics: vLLM's API server, where it is one process, as
# ``--api-server-count 1``, the default, has it; a multiprocess registry has no such counter) and the
# output tokens the engine generated
COUNTERS: dict[str, str] = {
    "api_cpu_ms": "process_cpu_seconds_total",
    "output_tokens": "vllm:generation_tokens_total",
}


def parse_sums(text: str) -> dict[str, tuple[float, float]]:
    """``{histogram: (sum, count)}`` of the histograms in :data:`HISTOGRAMS`, and ``{counter: (value,
    1)}`` of the counters in :data:`COUNTERS`, each summed over its label sets (engines, models) in one
    Prometheus text body; one that is absent is left out."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(HISTOGRAMS.values())
    counters = set(COUNTERS.values())
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        counter = line.startswith(tuple(counters))
        if not counter and (not line.startswith("vllm:") or not ("_sum" in line or "_count" in line)):
            continue
        try:
            for fam in text_string_to_metric_families(line + "\n"):
                for s in fam.samples:
                    if s.name in counters:
                        out.setdefault(s.name, [0.0, 1.0])[0] += float(s.value)
                        continue
                    for suffix, i in (("_sum", 0), ("_count", 1)):
                        base = s.name[: -len(suffix)] if s.name.endswith(suffix) else None
                        if base in wanted:
                            out.setdefault(base, [0.0, 0.0])[i] += float(s.value)
        except (ValueError, TypeError, IndexError):
            continue
    return {k: (v[0], v[1]) for k, v in out.items()}


def scrape_sums(url: str, timeout: float = 10.0) -> tuple[dict[str, tuple[float, float]] | None, str | None]:
    """The histograms' sums and counts at ``url``/metrics now, or None and why."""
    from ..telemetry.http import get

    got = get(url.rstrip("/") + "/metrics", timeout=timeout)
    if got is None:
        return None, "/metrics did not answer"
    status, body = got
    if status != 200:
        return None, f"/metrics answered HTTP {status}"
    return parse_sums(body.decode("utf-8", "replace")), None


def delta(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, Any]:
    """The point's figures from two scrapes: each histogram's mean over the samples the point added
    (ms for times; None where it added none or a counter went back: a restart), and the requests and
    engine steps counted; the API server's CPU (``api_cpu_ms``) and the output tokens generated over the
    point (None where a counter is absent or went back). (They include ``vllm bench serve``'s one test
    request before its timed run.) In a closed loop of c clients the server's time per output token is
    the time of a decode step with about c requests in it."""
    out: dict[str, Any] = {}
    for key, name in HISTOGRAMS.items():
        b, a = before.get(name), after.get(name)
        if a is None or b is None or a[1] - b[1] <= 0 or a[0] < b[0]:
            out[key] = None
            continue
        mean = (a[0] - b[0]) / (a[1] - b[1])
        out[key] = mean if key == "tokens_per_step" else mean * 1e3
    req = _count(before, after, HISTOGRAMS["ttft_ms"])
    steps = _count(before, after, HISTOGRAMS["tokens_per_step"])
    out["requests"] = req
    out["steps"] = steps
    for key, name in COUNTERS.items():
        b, a = before.get(name), after.get(name)
        if a is None or b is None or a[0] < b[0]:
            out[key] = None
        else:
            out[key] = (a[0] - b[0]) * (1e3 if key == "api_cpu_ms" else 1.0)
    return out


def _count(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]], name: str
) -> int | None:
    b, a = before.get(name), after.get(name)
    if a is None or b is None or a[1] < b[1]:
        return None
    return int(a[1] - b[1])
