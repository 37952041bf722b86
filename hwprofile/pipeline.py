"""From inputs to a plan: load profiles and rules, match, stack the override layers, read the model,
and call the planner. The reading is driven from here (profiles and rules through ``match``, override
files through ``config``, the model through ``model``); the rule matching is pure, and the planner
probes nothing and reads only the two tables shipped in the package (gpus.yaml, models.yaml)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .config import ConfigError, Source
from .config.layers import (
    Layer,
    Overrides,
    cli_layer,
    config_root,
    env_layer,
    file_layer,
    merge,
    overrides_d,
    overrides_layer,
)
from .config.settings import Settings, broken_relations
from .host.snapshot import HostSnapshot
from .host.snapshot_io import snapshot_from_dict
from .match import profiles as prof
from .match.rules import RuleResult, host_facts, load_rules, match
from .model import ModelFacts, resolve_model
from .record import record

if TYPE_CHECKING:
    from .plan.kvpin import KvRecord
    from .plan.predict import Calibration
    from .plan.types import Plan


def _warn(msg: str, *args: object) -> None:
    """A warning to the ``hwprofile`` logger (``logging`` is imported by the two rare paths that warn,
    not by every plan)."""
    import logging

    logging.getLogger("hwprofile").warning(msg, *args)


class Resolution(NamedTuple):
    """The profile chosen (and why), and the settings: ``merged`` as the layers set them (no
    defaults), ``settings`` typed, built once from them, every setting they leave unset at its
    declared default; ``provenance``: the layer that set each setting the layers set."""

    profile: str
    chain: list[prof.ProfileFile]
    matched_because: list[str]
    results: list[RuleResult]
    settings: Settings
    provenance: dict[tuple[str, ...], Source]
    merged: dict[str, Any]


def user_layers(
    root: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    sets: Sequence[str | Overrides] = (),
    environ: Mapping[str, str] | None = None,
) -> list[Layer]:
    """The layers above the profiles; ``sets``: ``--set`` texts, and typed :class:`Overrides` (a degrade
    step) laid over them, each its own layer with its own source."""
    layers = overrides_d(root)
    for f in overrides:
        if not os.path.isfile(f):
            raise ConfigError(f"--overrides {f}: no such file")
        layers.append(file_layer(f, "overrides"))
    env = env_layer(os.environ if environ is None else environ)
    if env:
        layers.append(env)
    cli = cli_layer([s for s in sets if isinstance(s, str)])
    if cli:
        layers.append(cli)
    for o in sets:
        if isinstance(o, Overrides) and (typed := overrides_layer(o)) is not None:
            layers.append(typed)
    return layers


def resolve_settings(
    host: HostSnapshot,
    root: str | os.PathLike[str],
    profile: str | None = None,
    overrides: Sequence[str] = (),
    sets: Sequence[str | Overrides] = (),
    environ: Mapping[str, str] | None = None,
) -> Resolution:
    profiles = prof.site_and_builtin(root)  # the built-ins read as the chain asks for them
    rules = load_rules(root)
    upper = user_layers(root, overrides, sets, environ)
    # A 'profile:' from an overrides file, the environment or --set forces the profile too.
    forced_by_layer = merge(upper)[0].get("profile")
    facts = host_facts(host)
    winner, results = match(rules, facts)
    chosen = profile or forced_by_layer
    if chosen:
        because = [f"profile {chosen} forced by " + ("--profile" if profile else "an override")]
        name = chosen
    elif winner is None:
        raise ConfigError("no matching rule: rules.yaml should end with a catch-all rule")
    else:
        name = winner.rule.profile
        because = [f"rule {winner.rule.file}:{winner.rule.line}: {winner.rule.why}"] + [
            f"{c.predicate}: {c.detail}" for c in winner.checks
        ]
    chain = prof.resolve(name, profiles, asked_at="--profile" if profile else "matched rule")
    merged, provenance = merge([*prof.layers(chain), *upper])
    settings, _ = Settings.from_tree(merged)
    broken = broken_relations(settings)
    if broken:

        def where(key: str) -> str:
            src = provenance.get(tuple(key.split(".")))
            return f"{key} from {src}" if src else f"{key} by default"

        raise ConfigError("; ".join(f"{what} ({where(lo)}, {where(hi)})" for lo, hi, what in broken))
    return Resolution(name, chain, because, results, settings, provenance, merged)


def load_models(
    settings: Settings, model: str | None, draft: str | None
) -> tuple[ModelFacts, ModelFacts | None]:
    """The target (``--model``, else the ``model`` setting) and the draft (``--draft``, else
    ``speculative.draft``; None when neither names one). An empty name is an error (resolve_model
    says so), not "use the default"."""
    target = resolve_model(model if model is not None else settings.model, "model")
    draft_spec = draft if draft is not None else settings.speculative.draft
    if draft_spec is None:
        return target, None
    from .model.tokenizer_check import tokenizer_of

    drafted = resolve_model(draft_spec, "draft")
    # both tokenizers read here, for the planner's comparison (a draft whose ids mean other tokens)
    return (
        target._replace(tokenizer=tokenizer_of(target.path, "target")),
        drafted._replace(tokenizer=tokenizer_of(drafted.path, "draft")),
    )


def make_plan(
    host: HostSnapshot,
    root: str | os.PathLike[str] | None = None,
    profile: str | None = None,
    overrides: Sequence[str] = (),
    sets: Sequence[str | Overrides] = (),
    model: str | None = None,
    draft: str | None = None,
    environ: Mapping[str, str] | None = None,
    nodes: Sequence[HostSnapshot] = (),
    addresses: Sequence[str] = (),
) -> Plan:
    """The typed plan for ``host`` from these inputs (``plan.to_json()`` is ``plan --json``); with
    ``nodes`` (the other hosts' snapshots, at ``addresses``, node 0's first), a plan over several
    hosts. Raises :class:`~.plan.PlanRefused` when nothing fits, :class:`~.config.ConfigError` on bad
    input. The profile is the one node 0 matches."""
    from .plan import PlanRefused, build_plan

    root = root or config_root()
    res = resolve_settings(host, root, profile, overrides, sets, environ)
    target, draft_facts = load_models(res.settings, model, draft)
    assumed = None
    if model is None:  # no --model: say which model was planned, and where that name came from
        src = res.provenance.get(("model",))
        assumed = (
            f"no --model given: the model setting{f' from {src}' if src else ' (its default)'}, {target.name}"
        )
        target = target._replace(origin=f"{assumed}; {target.origin}" if target.origin else assumed)
    pools = load_kv_pools() if res.settings.supervise.pin_kv_pool else None
    try:
        plan = build_plan(
            host,
            res.settings,
            res.provenance,
            res.profile,
            res.matched_because,
            target,
            draft_facts,
            tuple(nodes),
            tuple(addresses),
            calibration=load_calibration(root, host),
            kv_pools=pools,
            interconnect=load_interconnect(root, host),
            interconnect_source=interconnect_path(root, host),
        )
    except PlanRefused as e:
        if assumed:
            e.message = f"{e.message} ({assumed})"
            e.suggestions = [*e.suggestions, "or name the model to plan: --model DIR|NAME"]
        raise
    return plan


KV_POOLS_FILE = "kv-pools.json"  # in the state directory (runtime.dirs.state_dir): plan.kvpin's records
KV_POOLS_CAP = 4 * 2**20


def kv_pools_path() -> str:
    """Where the KV pools vLLM measured are recorded: ``<state dir>/kv-pools.json``."""
    from .runtime.dirs import state_dir

    return os.path.join(state_dir(), KV_POOLS_FILE)


def load_kv_pools(path: str | None = None) -> dict[str, list[KvRecord]]:
    """The recorded KV pools (:func:`hwprofile.plan.kvpin.parse_pools`); none where the file is
    missing, unreadable or not such a document (a pin is an optimisation: its absence is no error)."""
    import json

    from .plan.kvpin import parse_pools
    from .runtime.files import UnsafeFile, read_bounded

    try:
        data = read_bounded(path or kv_pools_path(), KV_POOLS_CAP)
        return parse_pools(json.loads(data))
    except (OSError, UnsafeFile, ValueError, UnicodeDecodeError):
        return {}


CALIBRATION_CAP = 16 * 2**20  # a bench.json of many rounds and points stays far below this


def calibration_path(root: str | os.PathLike[str], host: HostSnapshot) -> str:
    """``<root>/calibration/<fingerprint>.json``: where this host's measured calibration is read from."""
    from .plan.candidates import host_fingerprint

    return os.path.join(os.fspath(root), "calibration", host_fingerprint(host) + ".json")


def load_calibration(root: str | os.PathLike[str], host: HostSnapshot) -> Any:
    """This host's calibration (a ``hwprofile bench`` result, ``hwprofile.bench/1``, copied to
    :func:`calibration_path`), or None when there is none. A file that is not such a result, or one
    measured on other GPUs (their UUIDs differ), is an input error: it names the file."""
    import json

    from .runtime.files import UnsafeFile, read_bounded

    path = calibration_path(root, host)
    try:
        data = read_bounded(path, CALIBRATION_CAP)
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError) as e:
        raise ConfigError(f"{path}: cannot read the calibration: {e}") from None
    if len(data) > CALIBRATION_CAP:
        raise ConfigError(f"{path}: larger than {CALIBRATION_CAP} bytes; not a hwprofile bench result")

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON has")

    try:
        doc = json.loads(data, parse_constant=constant)
    except RecursionError:
        raise ConfigError(f"{path}: not JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not JSON ({e})") from None
    return calibration_from_bench(doc, path, host)


INTERCONNECT_CAP = 1 << 20


def interconnect_path(root: str | os.PathLike[str], host: HostSnapshot) -> str:
    """``<root>/interconnect/<fingerprint>.json``: this host's recorded interconnect check
    (``hwprofile doctor --interconnect`` writes it; plans read it)."""
    from .plan.candidates import host_fingerprint

    return os.path.join(os.fspath(root), "interconnect", host_fingerprint(host) + ".json")


def load_interconnect(root: str | os.PathLike[str], host: HostSnapshot) -> Any:
    """This host's recorded :class:`~.plan.interconnect.Report`, or None when the check has not run
    here. A file that is not such a result is an input error naming the file; one recorded for other
    GPUs or under another driver is returned as it is: the planner ignores it with the reason
    (:func:`~.plan.interconnect.stale`)."""
    import json

    from .plan.interconnect import report_from_dict
    from .runtime.files import UnsafeFile, read_bounded

    path = interconnect_path(root, host)
    try:
        data = read_bounded(path, INTERCONNECT_CAP)
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError) as e:
        raise ConfigError(f"{path}: cannot read the interconnect check: {e}") from None
    if len(data) > INTERCONNECT_CAP:
        raise ConfigError(
            f"{path}: larger than {INTERCONNECT_CAP} bytes; not a hwprofile interconnect result"
        )
    try:
        report = report_from_dict(json.loads(data), path)
    except RecursionError:
        raise ConfigError(f"{path}: not JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {e}" if str(e).startswith(path) else f"{path}: not JSON ({e})") from None
    return report


# what a measurement can be: anything outside is a file damaged or not measured (a bound, not a guess)
_PLAUSIBLE = {
    "concurrency": (1, 1_000_000),
    "p50_tpot_ms": (1e-3, 600_000.0),  # a microsecond to ten minutes a token
    "p50_ttft_ms": (1e-3, 86_400_000.0),  # to a day
    "server_metrics.prefill_ms": (0.0, 86_400_000.0),  # the engine's part of a TTFT (its /metrics)
    "server_metrics.queue_ms": (0.0, 86_400_000.0),
    "server_metrics.api_cpu_ms": (0.0, 1e10),  # the API server's CPU over one point (ms): to ~4 months
    "server_metrics.output_tokens": (0.0, 1e12),
    "server_metrics.steps": (0, 1_000_000_000_000),
    "server_metrics.requests": (0, 1_000_000_000_000),
    "output_throughput": (1e-3, 1e8),  # tokens/s of one plan
    "input_len": (1, 100_000_000),
    "output_len": (1, 100_000_000),
    "instances": (1, 65_536),
    "layout.tensor_parallel_size": (1, 4096),
}


def _bench_bad(path: str, why: str) -> ConfigError:
    return ConfigError(f"{path}: not a usable hwprofile bench result: {why}")


def _bench_number(path: str, value: object, key: str, where: str, whole: bool = False) -> Any:
    """``value`` checked as a measurement of ``key`` (its type, finite, within :data:`_PLAUSIBLE`)."""
    import math

    lo, hi = _PLAUSIBLE[key]
    number = value if type(value) is int or (not whole and type(value) is float) else None
    if number is None or not math.isfinite(number) or not lo <= number <= hi:
        kind = "a whole number" if whole else "a number"
        raise _bench_bad(
            path, f"{where}: {value!r:.60}: expected {kind} from {lo:g} to {hi:g} (a measurement)"
        )
    return value


def _bench_host_check(doc: dict[str, Any], path: str, host: HostSnapshot) -> None:
    """The bench document's GPUs, where it names them, are among this host's."""
    hostdoc = doc.get("host")
    if hostdoc is not None and not isinstance(hostdoc, dict):
        raise _bench_bad(path, "host: expected an object")
    gpus = (hostdoc or {}).get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        raise _bench_bad(path, "host.gpus: expected a list")
    theirs = {u for g in gpus or [] if isinstance(g, dict) and (u := g.get("uuid")) is not None}
    if not all(isinstance(u, str) for u in theirs):
        raise _bench_bad(path, "host.gpus[].uuid: expected text")
    ours = {g.uuid for g in host.usable_gpus if g.uuid is not None}
    if theirs and ours and not theirs <= ours:
        raise _bench_bad(path, f"measured on GPUs {sorted(theirs)}, this host has {sorted(ours)}")


def _bench_points(
    summary: Sequence[object], path: str, n_instances: int
) -> dict[int, tuple[int, float, float, float]]:
    """{concurrency: (concurrency, TPOT ms, TTFT ms, output tok/s)} from the plan's summary rows."""
    points: dict[int, tuple[int, float, float, float]] = {}
    for i, row in enumerate(summary):
        if not isinstance(row, dict):
            continue  # not a measured row
        m = row.get("metrics")
        try:
            raw = [m[k]["median"] for k in ("p50_tpot_ms", "p50_ttft_ms", "output_throughput")]  # type: ignore[index]  # None: TypeError, caught
            conc = row["concurrency"]
        except (KeyError, TypeError, IndexError):
            continue  # not measured (a round that failed): left out
        where = f"plans[0].summary[{i}]"
        c = _bench_number(path, conc, "concurrency", f"{where}.concurrency", whole=True)
        if all(type(v) in (int, float) and v == 0 for v in raw):  # nothing served at this concurrency
            _warn("%s: %s (concurrency %d): every median is 0 (nothing served): left out", path, where, c)
            continue
        tpot, ttft, tps = (
            float(_bench_number(path, v, k, f"{where}.metrics.{k}.median"))
            for v, k in zip(raw, ("p50_tpot_ms", "p50_ttft_ms", "output_throughput"), strict=True)
        )
        if c in points:
            raise _bench_bad(path, f"{where}.concurrency: {c} measured twice")
        # c requests in flight, each a token every tpot ms, on each instance: the most tokens/s there
        # can be (4x slack for medians of different rounds); more is no measurement of this plan
        ceiling = 4 * n_instances * c * 1000.0 / tpot
        if tps > ceiling:
            raise _bench_bad(
                path,
                f"{where}: output_throughput {tps:g} tok/s with {c} requests at TPOT {tpot:g} ms on "
                f"{n_instances} instance(s): more than {ceiling:g} tok/s can be (not a measurement)",
            )
        points[c] = (c, tpot, ttft, tps)
    return points


def calibration_from_bench(doc: object, path: str, host: HostSnapshot) -> Calibration:
    """The :class:`~.plan.predict.Calibration` in a ``hwprofile.bench/1`` document: its first plan's
    median TPOT, TTFT and output tokens/s per concurrency, the workload's lengths, and the TP its
    settings name (``layout.tensor_parallel_size`` among its non-default settings; else None: the
    plan hwprofile makes on this host). A calibration is a measurement: every value is checked as
    one (its type, finite, positive, within :data:`_PLAUSIBLE`); one that is not is an error naming
    the file and the value (a row without the three medians, a round that failed, is left out)."""
    from .plan.predict import Calibration

    wl, plan, summary, settings = _bench_first_plan(doc, path, host)
    instances = plan.get("instances")
    n_instances = (
        1 if instances is None else _bench_number(path, instances, "instances", "plans[0].instances", True)
    )
    points = _bench_points(summary or [], path, n_instances)
    if not points:
        raise _bench_bad(path, "no concurrency with p50_tpot_ms, p50_ttft_ms and output_throughput medians")
    tp = _bench_setting(settings, "layout.tensor_parallel_size")
    if tp is not None:
        tp = _bench_number(
            path,
            tp,
            "layout.tensor_parallel_size",
            "plans[0].non_default_settings layout.tensor_parallel_size",
            True,
        )
    if "input_len" not in wl or "output_len" not in wl:
        raise _bench_bad(path, "workload lengths: input_len and output_len are required")
    outside = _bench_outside_latency(plan.get("runs"), path, set(points))
    api_cpu = _bench_api_cpu(plan.get("runs"), path, set(points))
    batched = plan.get("max_num_batched_tokens") or _bench_setting(settings, "engine.max_num_batched_tokens")
    seqs = plan.get("max_num_seqs")
    created = doc.get("created") if isinstance(doc, dict) else None  # a dict: checked above
    model, facts = _bench_model(plan, path)
    speculation = _bench_speculation(plan, path)
    return Calibration(
        path,
        created if isinstance(created, str) else None,
        _bench_number(path, wl["input_len"], "input_len", "workload.input_len", True),
        _bench_number(path, wl["output_len"], "output_len", "workload.output_len", True),
        n_instances,
        tp,
        tuple(sorted(points.values())),
        seqs if type(seqs) is int and 1 <= seqs <= 1_000_000 else None,
        batched if type(batched) is int and 1 <= batched <= 100_000_000 else None,
        outside,
        api_cpu,
        model,
        facts,
        *speculation,
        *_bench_acceptance(summary or [], path, speculation, (n_instances, seqs)),
    )


def _bench_speculation(
    plan: dict[str, Any], path: str
) -> tuple[tuple[str, int] | None, tuple[tuple[int, int | None, int], ...], str | None]:
    """The speculation a bench plan ran (``plans[0].speculative``): ("none", 0) where it names none,
    (method, k) where it names one, None where the document does not say (an older one); its k table
    (``num_speculative_tokens_per_batch_size``, () where none) and its draft's path or name."""
    if "speculative" not in plan:
        return None, (), None
    spec = plan["speculative"]
    if spec is None:
        return ("none", 0), (), None
    bad = _bench_bad(path, "plans[0].speculative: expected null or its method and num_speculative_tokens")
    if not isinstance(spec, dict):
        raise bad
    method, k, draft = spec.get("method"), spec.get("num_speculative_tokens"), spec.get("model")
    if (
        not isinstance(method, str)
        or not method
        or len(method) > 64
        or type(k) is not int
        or not 0 <= k <= 64
    ):
        raise bad
    if draft is not None and (not isinstance(draft, str) or len(draft) > 4096):
        raise bad
    table = spec.get("num_speculative_tokens_per_batch_size") or []
    rows = table if isinstance(table, list) and len(table) <= 64 else None
    if rows is None or not all(_k_row(row) for row in rows):
        raise _bench_bad(
            path, "plans[0].speculative.num_speculative_tokens_per_batch_size: expected [low, high, k] rows"
        )
    if not k or method == "none":
        return ("none", 0), (), None
    return (method, k), tuple((lo, hi, kk) for lo, hi, kk in rows), draft


def _k_row(row: object) -> bool:
    """``row`` is a [low, high or null, k] row of a k table (whole numbers, k up to 64)."""
    if not isinstance(row, list) or len(row) != 3:
        return False
    lo, hi, k = row
    return (
        type(lo) is int
        and lo >= 0
        and (hi is None or (type(hi) is int and hi >= lo))
        and type(k) is int
        and 0 <= k <= 64
    )


def _bench_acceptance(
    summary: Sequence[object],
    path: str,
    speculation: tuple[tuple[str, int] | None, tuple[tuple[int, int | None, int], ...], str | None],
    engine: tuple[int, object],
) -> tuple[float | None, float | None]:
    """The mean acceptance length a bench measured (the median over its summary rows of each row's
    median ``mean_acceptance_length``, from vLLM's speculative counters), each checked as a measurement
    (1 to 65: 1 + accepted / drafts, at most 64 proposals), and the per-token acceptance it implies: the
    median over the rows of each row's at the k its plan ran (``speculation``:
    :func:`_bench_speculation`'s; its table, else its k) at the requests an instance ran there
    (``engine``: the plan's instances and max_num_seqs); (None, None) where no row has one (no
    speculation, or its counters were not read)."""
    import statistics

    from .plan.candidates import running
    from .plan.predict import Speculation, acceptance_of_length

    spec, table, _ = speculation
    instances, seqs = engine[0], engine[1] if type(engine[1]) is int else None
    k_of = Speculation(spec[0], table, spec[1], 0.0, None, "") if spec and spec[1] else None
    lengths, rates = [], []
    for i, row in enumerate(summary):
        m = row.get("mean_acceptance_length") if isinstance(row, dict) else None
        if m is None:
            continue
        v = m.get("median") if isinstance(m, dict) else None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 1.0 <= v <= 65.0:  # NaN, inf fail
            raise _bench_bad(path, f"plans[0].summary[{i}].mean_acceptance_length.median: expected 1 to 65")
        lengths.append(float(v))
        c = row.get("concurrency") if isinstance(row, dict) else None
        k = k_of.k_at(running(c, instances, seqs)) if k_of is not None and type(c) is int else 0
        if k:
            rates.append(acceptance_of_length(float(v), k))
    return (
        statistics.median(lengths) if lengths else None,
        round(statistics.median(rates), 6) if rates else None,
    )


def _bench_model(plan: dict[str, Any], path: str) -> tuple[str | None, tuple[tuple[str, Any], ...]]:
    """The model a bench plan measured: its path or name (``plans[0].model``) and the facts its steps'
    cost follows (``plans[0].model_facts``, :meth:`~.plan.types.ModelSummary.cost_facts`), each checked
    for its type; (None, ()) where the document names none (then a plan takes it as its model's)."""
    from .plan.types import ModelSummary

    model, facts = plan.get("model"), plan.get("model_facts")
    if model is not None and (not isinstance(model, str) or not model or len(model) > 4096):
        raise _bench_bad(path, "plans[0].model: expected the model's path or name")
    if facts is None:
        return model, ()
    if not isinstance(facts, dict) or set(facts) != set(ModelSummary.COST_FACTS):
        raise _bench_bad(
            path, f"plans[0].model_facts: expected an object of {', '.join(ModelSummary.COST_FACTS)}"
        )
    for k, v in facts.items():
        if (v is not None and type(v) not in (int, str)) or (isinstance(v, str) and len(v) > 256):
            raise _bench_bad(path, f"plans[0].model_facts.{k}: expected a whole number, a name or null")
    return model, tuple((k, facts[k]) for k in ModelSummary.COST_FACTS)


def _bench_server_points(
    runs: object, measured: set[int]
) -> Iterator[tuple[str, int, dict[str, Any], dict[str, Any]]]:
    """(where, concurrency, point, its ``server_metrics``) of each point of a bench plan's ``runs`` at a
    measured concurrency whose server's /metrics were read."""
    for i, run in enumerate(runs if isinstance(runs, list) else []):
        points = run.get("points") if isinstance(run, dict) else None
        for j, point in enumerate(points if isinstance(points, list) else []):
            sm = point.get("server_metrics") if isinstance(point, dict) else None
            c = point.get("concurrency") if isinstance(point, dict) else None
            if isinstance(sm, dict) and type(c) is int and c in measured:
                yield f"plans[0].runs[{i}].points[{j}]", c, point, sm


def _bench_outside_latency(runs: object, path: str, measured: set[int]) -> tuple[tuple[int, float], ...]:
    """((concurrency, ms), ...): a request's latency outside the engine's steps at each measured
    concurrency, the median over the repeats of the client's mean TTFT less vLLM's queue and prefill
    means (``server_metrics``, bench/servermetrics.py): means with means. A repeat whose /metrics were
    not read, or that lacks a figure, adds nothing (unknown, not 0), nor one where the engine's part
    is not below the client's TTFT (no latency measured there), nor one whose streamed tokens reached
    the client merged (plan/servercost.py ``merged_stream``); a concurrency with none is left out. A
    value that is not a measurement is an error naming it."""
    import statistics

    from .plan.servercost import merged_stream

    found: dict[int, list[float]] = {}
    for where, c, point, sm in _bench_server_points(runs, measured):
        lat = point.get("latency_ms")
        ttft = lat.get("ttft") if isinstance(lat, dict) else None
        client = ttft.get("mean") if isinstance(ttft, dict) else None
        if client is None or sm.get("prefill_ms") is None or sm.get("queue_ms") is None:
            continue
        tpot = lat.get("tpot") if isinstance(lat, dict) else None
        if merged_stream(tpot.get("p50") if isinstance(tpot, dict) else None, sm.get("tpot_ms")):
            continue  # its client TTFT is the merged chunk's, not the first token's
        mean = float(_bench_number(path, client, "p50_ttft_ms", f"{where}.latency_ms.ttft.mean"))
        engine = sum(
            float(_bench_number(path, sm[k], f"server_metrics.{k}", f"{where}.server_metrics.{k}"))
            for k in ("queue_ms", "prefill_ms")
        )
        if engine < mean:
            found.setdefault(c, []).append(mean - engine)
    return tuple(sorted((c, statistics.median(v)) for c, v in found.items() if v))


def _bench_api_cpu(
    runs: object, path: str, measured: set[int]
) -> tuple[tuple[int, float, float, float], ...]:
    """((concurrency, ms, tokens, steps), ...): the API server process's own CPU per request at each
    measured concurrency, with the output tokens and the engine steps per request, from its /metrics
    ``process_cpu_seconds_total``, vLLM's generated tokens and its steps over the requests the point
    added (``server_metrics``: ``api_cpu_ms``, ``output_tokens``, ``steps``, ``requests``): the median
    repeat by its CPU per request (the lower of the two middle ones), its three figures together. A
    repeat without them (a server whose /metrics have no process counter: several API server
    processes) adds nothing; a value that is not a measurement is an error naming it."""
    keys = ("api_cpu_ms", "output_tokens", "steps", "requests")
    found: dict[int, list[tuple[float, float, float]]] = {}
    for where, c, _, sm in _bench_server_points(runs, measured):
        if any(sm.get(k) is None for k in keys):
            continue
        cpu, tokens, steps, n = (
            float(
                _bench_number(
                    path, sm[k], f"server_metrics.{k}", f"{where}.server_metrics.{k}", k in keys[2:]
                )
            )
            for k in keys
        )
        if n >= 1:
            found.setdefault(c, []).append((cpu / n, tokens / n, steps / n))
    return tuple((c, *sorted(v)[(len(v) - 1) // 2]) for c, v in sorted(found.items()))


def _bench_first_plan(
    doc: object, path: str, host: HostSnapshot
) -> tuple[dict[str, Any], dict[str, Any], list[Any] | None, list[Any] | None]:
    """The parts of a bench document a calibration reads, each checked for its shape: the workload, the
    first plan, its summary rows and its non-default settings (None where absent); the document made on
    this host (:func:`_bench_host_check`). An error names the file and what is wrong."""
    if not isinstance(doc, dict) or doc.get("schema") != "hwprofile.bench/1":
        raise _bench_bad(path, "schema is not hwprofile.bench/1")
    wl, plans = doc.get("workload"), doc.get("plans")
    if not isinstance(wl, dict) or not isinstance(plans, list) or not plans or not isinstance(plans[0], dict):
        raise _bench_bad(path, "no workload or no plans")
    _bench_host_check(doc, path, host)
    plan = plans[0]
    summary, settings = plan.get("summary"), plan.get("non_default_settings")
    if summary is not None and not isinstance(summary, list):
        raise _bench_bad(path, "plans[0].summary: expected a list")
    if settings is not None and not isinstance(settings, list):
        raise _bench_bad(path, "plans[0].non_default_settings: expected a list")
    return wl, plan, summary, settings


def _bench_setting(settings: list[Any] | None, key: str) -> object:
    """The value of one non-default setting of a bench plan (``{"key": ..., "value": ...}`` entries), or
    None where it is not among them."""
    return next((s.get("value") for s in settings or [] if isinstance(s, dict) and s.get("key") == key), None)


def predictions_at(
    inputs: PlanInputs, plan: Plan, input_len: int, output_len: int, concurrencies: Sequence[int], front: bool
) -> dict[int, Any]:
    """What ``plan`` (the plan a benchmark ran) predicts at each of ``concurrencies`` requests of
    ``input_len`` in / ``output_len`` out: per concurrency the :class:`~.plan.types.InstancePrediction`
    (as ``plan --json`` shows it) or None (nothing predicted: a CPU before a calibration, a GPU without
    datasheet figures). The plan's own first instance and engine settings, the calibration it was made
    with; only the workload differs. ``front``: the benchmark measured every instance through one URL
    (the requests shared, the output tokens/s of all of them); else the first instance alone took them."""
    import dataclasses

    from .plan.candidates import instance_prediction
    from .plan.checkpoint import calibration_for
    from .plan.layout import RULE_KINDS

    if not plan.instances:
        return {c: None for c in concurrencies}
    res = resolve_settings(inputs.host, inputs.config_root, inputs.profile, inputs.overrides, inputs.sets)
    target, named_draft = load_models(res.settings, inputs.model, inputs.draft)
    target, draft = _as_planned(target, named_draft, plan, res.settings, inputs.host, res.provenance)
    calibration = load_calibration(inputs.config_root, inputs.host)
    if calibration is not None:  # as the plan took it (plan._own_calibration)
        src = res.provenance.get(("speculative", "assumed_acceptance"))
        calibration, _ = calibration_for(
            calibration, plan.model, src is not None and src.kind not in RULE_KINDS
        )
    interconnect = load_interconnect(inputs.config_root, inputs.host)
    inst = plan.instances[0]
    n = len(plan.instances) if front else 1
    total = sum(i.ranks for i in plan.instances) if front else inst.ranks
    out: dict[int, Any] = {}
    for c in concurrencies:
        lay = dataclasses.replace(
            res.settings.layout,
            workload_input_len=input_len,
            workload_output_len=output_len,
            workload_concurrency=c,
        )
        settings = dataclasses.replace(res.settings, layout=lay)
        p = instance_prediction(
            inputs.host,
            inst,
            total,
            target,
            draft if inst.speculative is not None else None,
            settings,
            calibration,
            inst.tensor_parallel_size,
            interconnect,
        )
        if p is not None and n > 1:
            p = dataclasses.replace(p, output_tokens_per_s=round(p.output_tokens_per_s * n, 1))
        out[c] = p
    return out


def _as_planned(
    target: ModelFacts,
    named_draft: ModelFacts | None,
    plan: Plan,
    settings: Settings,
    host: HostSnapshot,
    provenance: Mapping[tuple[str, ...], Source],
) -> tuple[ModelFacts, ModelFacts | None]:
    """The model and the draft as the plan runs them: the checkpoint it took (``engine.weights_bits``,
    or the 4-bit one that fits: :func:`~.plan.build_plan`'s same steps), its weights as vLLM loads them
    under the plan's speculation, and the draft the plan chose (the caller's, the profile's or the
    planner's own)."""
    from .plan.checkpoint import choose_checkpoint, use_four_bit
    from .plan.loaded import as_loaded, device_cc
    from .plan.reasons import Reasons

    r = Reasons(provenance)  # the plan's reasons were said when it was made: these are thrown away
    model = choose_checkpoint(target, settings, r)
    if plan.model.name != model.name and plan.model.name in model.quantized_variants.values():
        model = use_four_bit(model, plan.model.name, r)
    inst = plan.instances[0]
    method = inst.speculative.method if inst.speculative is not None else None
    model = as_loaded(
        model, settings, method, host.software.vllm_version, r, device_cc(host), host.software.kernel_packages
    )
    if plan.draft is None:
        return model, None
    if named_draft is not None and plan.draft.name == named_draft.name:
        return model, named_draft
    return model, resolve_model(plan.draft.path or plan.draft.name, "draft")


@record
class PlanInputs:
    """What a plan is made from: a re-plan (the memory ladder's, a degrade step's, a reload's)
    starts from the same inputs with more ``--set`` overrides. The environment's ``HWPROFILE_*``
    layer is read again at each re-plan. A model given as a relative directory is kept absolute, so a
    re-plan (or a supervisor in another working directory) finds the same one."""

    host: HostSnapshot
    config_root: str
    profile: str | None = None
    overrides: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    model: str | None = None
    draft: str | None = None
    nodes: tuple[HostSnapshot, ...] = ()  # the other hosts of a multi-node plan
    addresses: tuple[str, ...] = ()  # every node's address, node 0's first (empty: their hostnames)
    node_rank: int = 0  # the node that runs this plan (launch/daemon --node-rank): its instances only

    def __post_init__(self) -> None:
        for name in ("model", "draft"):
            value = getattr(self, name)
            if value and not os.path.isabs(value) and os.path.isdir(value):
                object.__setattr__(self, name, os.path.abspath(value))
        object.__setattr__(self, "overrides", tuple(os.path.abspath(f) for f in self.overrides))

    def replan(self, extra: Sequence[str | Overrides] = ()) -> Plan:
        """The plan of these inputs, with ``extra`` ``--set`` overrides after their own (on a node of
        a multi-node plan: that node's instances)."""
        plan = self.whole_plan(extra)
        if not (plan.nodes > 1 or self.node_rank):
            return plan
        if not 0 <= self.node_rank < plan.nodes:
            raise ConfigError(
                f"--node-rank {self.node_rank}: node {self.node_rank} is not in this plan, which runs on {plan.nodes} "
                f"node(s), ranks 0 to "
                f"{plan.nodes - 1} (the host's place in --nodes, node 0 first)"
            )
        try:
            return plan.for_node(self.node_rank)
        except KeyError:
            raise ConfigError(
                f"--node-rank {self.node_rank}: the plan gives that node no instance of its own"
            ) from None

    def whole_plan(self, extra: Sequence[str | Overrides] = ()) -> Plan:
        """The plan of these inputs, every node's instances."""
        return make_plan(
            self.host,
            self.config_root,
            profile=self.profile,
            overrides=list(self.overrides),
            sets=[*self.sets, *extra],
            model=self.model,
            draft=self.draft,
            nodes=self.nodes,
            addresses=self.addresses,
        )

    def min_model_len(self) -> int | None:
        """The profile's ``engine.min_model_len`` (the ladder's context floor), as these inputs set it."""
        try:
            res = resolve_settings(
                self.host, self.config_root, self.profile, list(self.overrides), list(self.sets)
            )
            return res.settings.engine.min_model_len
        except Exception as e:  # a floor unknown is the ladder's own default, not a failed launch
            _warn("engine.min_model_len not known (%s): the ladder uses its own floor", e)
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.to_dict(),
            "config_root": self.config_root,
            "profile": self.profile,
            "overrides": list(self.overrides),
            "sets": list(self.sets),
            "model": self.model,
            "draft": self.draft,
            "nodes": [n.to_dict() for n in self.nodes],
            "addresses": list(self.addresses),
            "node_rank": self.node_rank,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str) -> PlanInputs:
        """The inputs of :meth:`to_json` (checked by the caller's contract: strings and lists of them)."""
        return cls(
            snapshot_from_dict(data["host"], source),
            str(data["config_root"]),
            data.get("profile"),
            tuple(data.get("overrides") or ()),
            tuple(data.get("sets") or ()),
            data.get("model"),
            data.get("draft"),
            tuple(snapshot_from_dict(n, source) for n in data.get("nodes") or ()),
            tuple(data.get("addresses") or ()),
            int(data.get("node_rank") or 0),
        )


def vllm_command(configured: str | None) -> str:
    """The vllm executable: as configured, else the one installed beside this Python, else on PATH."""
    import shutil
    import sys

    if configured:
        return configured
    beside = os.path.join(os.path.dirname(sys.executable), "vllm")
    if os.path.exists(beside):
        return beside
    return shutil.which("vllm") or "vllm"
