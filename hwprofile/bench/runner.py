"""One benchmark point: ``vllm bench serve`` (the installed vLLM's own load generator) against a
server, run as a subprocess with an argv list, its saved result JSON read back into a
:class:`Point`; the server's speculative-decoding counters scraped from ``/metrics`` before and
after and turned into the acceptance rate and mean acceptance length
(shared/facts/vllm-metrics.md §2: rate = Δaccepted / Δdraft_tokens, mean length = 1 + Δaccepted /
Δdrafts, per position = Δper_pos[i] / Δdrafts)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import OperationError
from ..plan.servercost import merged_stream
from ..telemetry.http import get_json
from ..telemetry.metrics import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS
from ..telemetry.scrape import scrape
from ..telemetry.window import CounterWindow
from .workloads import Workload, prompts_path

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 99)
LOG_TAIL_LINES = 25


class BenchFailed(OperationError):
    """``vllm bench serve`` failed or left no result (the message has its last output lines)."""


@dataclass(frozen=True)
class Target:
    """What a benchmark talks to: the server's base URL, the model name it serves, the tokenizer
    (a local directory or a hub name) that ``vllm bench serve`` counts tokens with, and the ``vllm``
    executable that runs the benchmark (the one that serves the plan)."""

    url: str
    model: str
    tokenizer: str
    vllm: str = "vllm"


def bench_argv(
    target: Target, wl: Workload, concurrency: int, result_dir: Path, result_filename: str
) -> list[str]:
    """The ``vllm bench serve`` command of one point (flags as in vLLM 0.32's ``--help``)."""
    return [
        target.vllm,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        target.url,
        "--model",
        target.model,
        "--tokenizer",
        target.tokenizer,
        *dataset_args(wl),
        "--num-prompts",
        str(wl.prompts_at(concurrency)),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        repr(float(wl.temperature)),
        "--percentile-metrics",
        ",".join(PERCENTILE_METRICS),
        "--metric-percentiles",
        ",".join(map(str, PERCENTILES)),
        "--seed",
        str(wl.seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_filename,
    ]


def dataset_args(wl: Workload) -> list[str]:
    """The dataset flags of one point: random tokens of ``input_len``, or the shipped real prompts
    (vLLM's ``sharegpt`` dataset reader) each answered with ``output_len`` tokens."""
    if wl.dataset == "prompts":
        return [
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            prompts_path(),
            "--sharegpt-output-len",
            str(wl.output_len),
        ]
    if wl.dataset == "random":
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(wl.input_len),
            "--random-output-len",
            str(wl.output_len),
        ]
    raise ValueError(f"bench dataset {wl.dataset!r} not resolved (one of random, prompts)")


def discover(url: str, vllm: str, tokenizer: str | None = None, timeout: float = 10) -> Target:
    """The target of a running server: its first model from ``/v1/models`` (vLLM's ``root`` is the
    model path it loaded, used as the tokenizer unless one is given). Raises :class:`BenchFailed`."""
    base = url.rstrip("/")
    try:
        data = get_json(base + "/v1/models", timeout=timeout)
        first = data["data"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise BenchFailed(
            f"{base}/v1/models: no model to benchmark ({e}); is a vLLM server running there?"
        ) from None
    model = str(first["id"])
    return Target(base, model, tokenizer or str(first.get("root") or model), vllm)


def spec_counters(url: str) -> tuple[dict[str, float] | None, str | None]:
    """The spec-decode counters of one scrape (None without speculation), and an error if the scrape failed."""
    r = scrape("bench", url, time.monotonic(), timeout=10)
    if r.status != "ok" or r.metrics is None:
        return None, r.error or r.status
    if not r.metrics.spec_decode:
        return None, None
    return {k: v for k, v in r.metrics.counters.items() if k.startswith("vllm:spec_decode_")}, None


def spec_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    """Acceptance from two scrapes of the counters (reset-aware, like the daemon's window)."""
    w = CounterWindow(float("inf"))
    w.add(0.0, before)
    w.add(1.0, after)
    drafts, tokens, acc = w.increase(DRAFTS), w.increase(DRAFT_TOKENS), w.increase(ACCEPTED)
    if drafts is None or tokens is None or acc is None:
        return None
    positions = sorted(
        (int(k.split("position=", 1)[1].rstrip("}")), k)
        for k in after
        if k.startswith(PER_POS + "{")
        if k.split("position=", 1)[1].rstrip("}").isdigit()
    )
    per_pos = [(w.increase(k) or 0.0) / drafts if drafts else None for _, k in positions]
    return {
        "num_drafts": drafts,
        "draft_tokens": tokens,
        "accepted_tokens": acc,
        "acceptance_rate": acc / tokens if tokens else None,
        "mean_acceptance_length": 1 + acc / drafts if drafts else None,
        "per_position_acceptance": per_pos,
    }


@dataclass(frozen=True)
class Point:
    """One concurrency of one run, from ``vllm bench serve``'s saved result."""

    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    latency_ms: dict[str, dict[str, float | None]]  # ttft/tpot/itl/e2el -> mean, p50, p99
    spec_decode: dict[str, Any] | None
    spec_decode_error: str | None
    vllm_bench: dict[str, Any]  # argv, result file, what it reported itself
    # the server's own view of the point (bench/servermetrics.py: /metrics histograms' means), None
    # where its /metrics could not be read (``server_metrics_error`` says why)
    server_metrics: dict[str, Any] | None = None
    server_metrics_error: str | None = None

    def stream_merged(self) -> str | None:
        """Why this point's client latencies do not time the engine's tokens, or None where nothing says
        so (:func:`merged_stream`: its client's median TPOT against the server's own mean)."""
        return merged_stream(
            self.latency_ms.get("tpot", {}).get("p50"), (self.server_metrics or {}).get("tpot_ms")
        )

    def metric(self, name: str) -> float | None:
        """``output_throughput``, ``p99_ttft_ms`` and the like (the comparison's metric names)."""
        if name.endswith("_ms"):
            stat, _, rest = name.partition("_")
            return self.latency_ms.get(rest[: -len("_ms")], {}).get(stat)
        v = getattr(self, name, None)
        return float(v) if isinstance(v, (int, float)) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "num_prompts": self.num_prompts,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "latency_ms": self.latency_ms,
            "spec_decode": self.spec_decode,
            "spec_decode_error": self.spec_decode_error,
            "vllm_bench": self.vllm_bench,
            "server_metrics": self.server_metrics,
            "server_metrics_error": self.server_metrics_error,
            "stream_merged": self.stream_merged(),
        }


def read_result(path: Path, concurrency: int, argv: list[str]) -> Point:
    """A :class:`Point` from the JSON ``vllm bench serve --save-result`` wrote (vLLM 0.32's keys)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchFailed(f"vllm bench serve left no readable result {path}: {e}") from None

    def num(key: str) -> float:
        v = d.get(key)
        if not isinstance(v, (int, float)):
            raise BenchFailed(f"{path}: no number under {key!r} (is this vLLM's bench result format?)")
        return float(v)

    lat = {
        m: {
            "mean": _opt(d.get(f"mean_{m}_ms")),
            **{f"p{p}": _opt(d.get(f"p{p}_{m}_ms")) for p in PERCENTILES},
        }
        for m in PERCENTILE_METRICS
    }
    reported = None
    if "spec_decode_acceptance_rate" in d:
        rate = _opt(d.get("spec_decode_acceptance_rate"))
        reported = {
            "acceptance_rate": rate / 100 if rate is not None else None,  # vLLM reports per cent
            "mean_acceptance_length": _opt(d.get("spec_decode_acceptance_length")),
            "num_drafts": _opt(d.get("spec_decode_num_drafts")),
            "draft_tokens": _opt(d.get("spec_decode_draft_tokens")),
            "accepted_tokens": _opt(d.get("spec_decode_accepted_tokens")),
        }
    return Point(
        concurrency=concurrency,
        num_prompts=int(num("num_prompts")),
        completed=int(num("completed")),
        failed=int(d.get("failed") or 0),
        duration_s=num("duration"),
        request_throughput=num("request_throughput"),
        output_throughput=num("output_throughput"),
        total_token_throughput=num("total_token_throughput"),
        latency_ms=lat,
        spec_decode=None,
        spec_decode_error=None,
        vllm_bench={"argv": argv, "result_file": str(path), "spec_decode_reported": reported},
    )


def _opt(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def run_point(
    target: Target,
    wl: Workload,
    concurrency: int,
    out_dir: Path,
    tag: str,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> Point:
    """Run ``vllm bench serve`` for one concurrency; its output goes to ``out_dir/<tag>.log``, its
    result to ``out_dir/<tag>.json``. Raises :class:`BenchFailed` with the log's last lines."""
    from ..runtime.dirs import private_dir

    private_dir(out_dir)  # never a link or another user's directory: vllm bench serve writes into it
    name = f"{tag}.json"
    result, log = out_dir / name, out_dir / f"{tag}.log"
    result.unlink(missing_ok=True)  # a link planted there goes, its target stays
    argv = bench_argv(target, wl, concurrency, out_dir, name)
    from .servermetrics import delta, scrape_sums

    before, err_before = spec_counters(target.url)
    sums_before, sums_err = scrape_sums(target.url)
    proc = _run_bench(target, argv, log, concurrency, timeout_s, env)
    if proc.returncode != 0 or not result.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise BenchFailed(
            f"vllm bench serve exited {proc.returncode} at concurrency {concurrency} "
            f"(log {log}); its last lines:\n{tail}"
        )
    after, err_after = spec_counters(target.url)
    sums_after, sums_err_after = scrape_sums(target.url)
    point = read_result(result, concurrency, argv)
    spec, err = None, err_before or err_after
    if before is not None and after is not None:
        spec = spec_delta(before, after)
    server = delta(sums_before, sums_after) if sums_before is not None and sums_after is not None else None
    return replace(
        point,
        spec_decode=spec,
        spec_decode_error=err,
        server_metrics=server,
        server_metrics_error=sums_err or sums_err_after,
    )


def _run_bench(
    target: Target,
    argv: list[str],
    log: Path,
    concurrency: int,
    timeout_s: float | None,
    env: dict[str, str] | None,
) -> subprocess.CompletedProcess[bytes]:
    """``vllm bench serve`` with its output into ``log`` (created, never opened through a link)."""
    try:
        # the log is created, never opened through a link a planted name points with
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise BenchFailed(f"{log}: cannot write the point's log: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            return subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                timeout=timeout_s,
                check=False,
            )
    except FileNotFoundError:
        raise BenchFailed(
            f"{target.vllm}: not found (vLLM is not installed here: pip install vllm)"
        ) from None
    except subprocess.TimeoutExpired:
        raise BenchFailed(
            f"vllm bench serve ran past {timeout_s:g} s at concurrency {concurrency}; log {log}"
        ) from None
