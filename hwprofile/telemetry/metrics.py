"""vLLM's ``/metrics`` text, parsed with prometheus-client's own parser, into the figures the policy
and the status view read. Names and formulas per release: shared/facts/vllm-metrics.md.

Only ``_total`` samples of counters are read (in single-process mode every counter also exports
``X_created`` as a gauge). A data-parallel server labels each rank's series with ``engine``: counters
and the running and waiting gauges are summed over the ranks, the KV usage is the fullest rank's (a
sum of fractions means nothing), and each rank's own running, waiting and KV usage are kept apart
(:attr:`VllmMetrics.engines`). The per-position counter is kept apart from the accepted-tokens total.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # 0.9+ / before 0.12
PREEMPTIONS = "vllm:num_preemptions_total"
GENERATION = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # 0.10.1+ / before 0.15

COUNTERS = (PREEMPTIONS, GENERATION, DRAFTS, DRAFT_TOKENS, ACCEPTED, PROMPT)


class MetricsError(ValueError):
    """A /metrics body that is not Prometheus text."""


@dataclass(frozen=True)
class VllmMetrics:
    """One scrape. ``engine``: v1 (series carry an ``engine`` label), v0, or None when the server
    exports no ``vllm:*`` series at all (``--disable-log-stats``)."""

    engine: str | None
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # name (or name{position=i}) -> value
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    itl_buckets: dict[float, float] = field(default_factory=dict)
    spec_decode: bool = False  # the spec_decode_* families exist (a speculative config is set)
    engines: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # engine label -> running, waiting, kv_usage

    @property
    def metrics_disabled(self) -> bool:
        return self.engine is None

    @property
    def running(self) -> float | None:
        return self.gauges.get(RUNNING)

    @property
    def waiting(self) -> float | None:
        return self.gauges.get(WAITING)

    @property
    def kv_usage(self) -> float | None:
        return next((self.gauges[n] for n in KV_USAGE if n in self.gauges), None)

    def window_values(self) -> dict[str, float]:
        """Everything a counter window follows: counters, per-position counters, histogram buckets."""
        out = dict(self.counters)
        out.update({f"ttft_bucket{{le={le}}}": v for le, v in self.ttft_buckets.items()})
        out.update({f"itl_bucket{{le={le}}}": v for le, v in self.itl_buckets.items()})
        return out


WANTED = (
    RUNNING,
    WAITING,
    *KV_USAGE,
    *COUNTERS,
    PER_POS,
    TTFT,
    *ITL,
    "vllm:spec_decode_",
)


def _wanted(text: str) -> str:
    """Only the samples read here, so the parser does no work for the rest of a real server's few
    hundred lines: no HELP/TYPE comments (samples are read by their own names, so untyped families
    do), no ``_created`` timestamps, no other family. One other ``vllm:`` sample is kept: it proves
    a server with stats even when none of the wanted ones is there yet."""
    keep: list[str] = []
    other = False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith("_created"):
            continue
        if name.startswith(WANTED):
            keep.append(line)
        elif not other and name.startswith("vllm:"):
            keep.append(line)
            other = True
    return "\n".join(keep) + "\n"


def parse(text: str) -> VllmMetrics:
    """Parse one /metrics body (raises :class:`MetricsError` on text that is not Prometheus')."""
    return parse_kept(kept(text))


def kept(text: str) -> str:
    """The lines of one /metrics body that :func:`parse_kept` reads (raises :class:`MetricsError` on a
    web page): two bodies with the same kept lines parse to the same figures."""
    head = text.lstrip()
    if head.startswith("<"):  # a web page (a proxy's, a UI's) answered on the URL: not a server's metrics
        first = head.splitlines()[0][:60] if head else ""
        raise MetricsError(
            f"an HTML or XML page, not Prometheus text (it begins {first!r}): is this URL a vLLM server?"
        )
    return _wanted(text)


# A busy server's histogram buckets (most of the lines read) are parsed this often, its gauges and
# counters at every scrape: the quantiles (status, the drift policy's TPOT, judged over minutes to hours)
# lag the counters by at most this much; the liveness policy reads counters and gauges only.
BUCKETS_EVERY_S = 5.0


class Parser:
    """:func:`parse` for one server's scrapes, one after another: a body whose kept lines did not change
    since the last one (an idle server: its counters and histograms stand still) is not parsed again,
    and the histogram bucket lines are parsed at most every :data:`BUCKETS_EVERY_S` (between, the last
    buckets parsed stand beside the new gauges and counters). ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: tuple[str, VllmMetrics] | None = None
        self._buckets: tuple[float, str, VllmMetrics] | None = None  # when, the bucket lines, their figures
        self._seen: dict[str, list[Sample]] = {}  # the last body's lines, parsed (see _samples)

    def __call__(self, text: str) -> VllmMetrics:
        lines = kept(text)
        if self._last is not None and self._last[0] == lines:
            return self._last[1]
        m = self._parse(lines)
        self._last = (lines, m)
        return m

    def _parse(self, lines: str) -> VllmMetrics:
        now = self.clock()
        split: tuple[list[str], list[str]] = ([], [])  # the bucket lines, the others
        for ln in lines.splitlines():
            split[0 if _is_bucket(ln) else 1].append(ln + "\n")
        buckets = "".join(split[0])
        last = self._buckets
        if last is not None and (last[1] == buckets or now - last[0] < BUCKETS_EVERY_S):
            m = parse_kept("".join(split[1]), self._seen)
            if m.engine is not None:  # else only bucket lines said the server has stats: the whole body
                return replace(m, ttft_buckets=last[2].ttft_buckets, itl_buckets=last[2].itl_buckets)
        m = parse_kept(lines, self._seen)
        self._buckets = (now, buckets, m)
        return m


def _is_bucket(line: str) -> bool:
    return line.split("{", 1)[0].split(" ", 1)[0].endswith("_bucket")


Sample = tuple[str, dict[str, str], float]


def _samples(text: str, seen: dict[str, list[Sample]] | None) -> list[Sample]:
    """The ``vllm:`` samples of the kept lines, each line parsed by prometheus-client's parser. With
    ``seen`` (a line -> its samples, one server's last body): a line unchanged since then is not parsed
    again (a busy server's counters move, most of its lines do not), and ``seen`` is left holding this
    body's lines only. The kept lines have no ``# TYPE`` comments: each line is its own family, so
    line by line is the whole body's parse."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Sample] = []
    now: dict[str, list[Sample]] = {}
    for line in text.splitlines():
        got = seen.get(line) if seen is not None else None
        if got is None:
            try:
                families = list(text_string_to_metric_families(line + "\n"))
            except (ValueError, TypeError, IndexError) as e:  # the parser is lax and fails midway
                raise MetricsError(f"not Prometheus text: {e}") from None
            got = [
                (x.name, x.labels, float(x.value))
                for fam in families
                if fam.name.startswith("vllm:")
                for x in fam.samples
            ]
        now[line] = got
        out.extend(got)
    if seen is not None:
        seen.clear()
        seen.update(now)
    return out


def parse_kept(text: str, seen: dict[str, list[Sample]] | None = None) -> VllmMetrics:
    """Parse the lines :func:`kept` kept of one /metrics body (``seen``: see :func:`_samples`)."""
    tally = _Tally()
    any_vllm, v1, spec = False, False, False
    for name, labels, value in _samples(text, seen):
        if name.endswith("_created"):
            continue
        any_vllm = True
        v1 = v1 or "engine" in labels
        if name.startswith("vllm:spec_decode_"):
            spec = True
        if _is_read(name) and not 0 <= value < float("inf"):  # NaN fails too: no count is that
            raise MetricsError(f"{name}{labels or ''} = {value}: not a count (finite, not negative)")
        tally.add(name, labels, value)
    return VllmMetrics(
        "v1" if v1 else ("v0" if any_vllm else None),
        tally.gauges,
        tally.counters,
        tally.ttft,
        tally.itl,
        spec,
        tally.engines if len(tally.engines) > 1 else {},
    )


def _is_read(name: str) -> bool:
    """Whether :func:`parse` reads the sample: it must then be a count."""
    return name in (PER_POS, *COUNTERS, RUNNING, WAITING, *KV_USAGE, TTFT + "_bucket") or (
        name.endswith("_bucket") and name[: -len("_bucket")] in ITL
    )


@dataclass
class _Tally:
    """The samples :func:`parse` reads, summed over the engines (data-parallel ranks) of one body."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    ttft: dict[float, float] = field(default_factory=dict)
    itl: dict[float, float] = field(default_factory=dict)
    itl_name: str | None = None
    engines: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        if name == PER_POS:
            pos = labels.get("position", "")
            if not pos.isdigit():
                raise MetricsError(f"{name}{labels}: position {pos!r} is not a number (0, 1, ...)")
            key = f"{PER_POS}{{position={int(pos)}}}"
            self.counters[key] = self.counters.get(key, 0.0) + value
        elif name in COUNTERS:
            self.counters[name] = self.counters.get(name, 0.0) + value
        elif name in (RUNNING, WAITING, *KV_USAGE):
            self._add_gauge(name, labels, value)
        elif name == TTFT + "_bucket":
            le = float(labels.get("le", "inf"))
            self.ttft[le] = self.ttft.get(le, 0.0) + value
        elif name.endswith("_bucket") and name[: -len("_bucket")] in ITL:
            self._add_itl(name[: -len("_bucket")], labels, value)

    def _add_gauge(self, name: str, labels: dict[str, str], value: float) -> None:
        """Requests running and waiting add up over the ranks; KV cache usage is the fullest rank's."""
        if name in (RUNNING, WAITING):
            self.gauges[name] = self.gauges.get(name, 0.0) + value
        else:
            self.gauges[name] = max(self.gauges.get(name, 0.0), value)  # the fullest rank
        if "engine" in labels:
            key = {RUNNING: "running", WAITING: "waiting"}.get(name, "kv_usage")
            rank = self.engines.setdefault(labels["engine"], {})
            rank[key] = rank.get(key, 0.0) + value if key != "kv_usage" else max(rank.get(key, 0.0), value)

    def _add_itl(self, base: str, labels: dict[str, str], value: float) -> None:
        """One inter-token latency histogram: the first one named in ``ITL`` wins over the others."""
        if self.itl_name is None or base == ITL[0]:
            if self.itl_name != base:
                self.itl.clear()
            self.itl_name = base
            le = float(labels.get("le", "inf"))
            self.itl[le] = self.itl.get(le, 0.0) + value


START_TIME = "process_start_time_seconds"


def start_time(text: str) -> float | None:
    """When the process behind a ``/metrics`` body started (prometheus-client's process collector,
    which vLLM's API server exports: Unix seconds); None when the body does not say or is not
    Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = [line for line in text.splitlines() if line.startswith(START_TIME + " ")]
    if len(lines) != 1:
        return None
    try:
        for fam in text_string_to_metric_families(lines[0] + "\n"):
            for sample in fam.samples:
                if sample.name == START_TIME and 0 < float(sample.value) < float("inf"):
                    return float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None
    return None
