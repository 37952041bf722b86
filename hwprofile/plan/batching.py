"""The batching grid and its choice: one layout candidate at other ``max_num_seqs`` and
``max_num_batched_tokens`` (vLLM's defaults, the planned values, halved and doubled sequences, the
workload's requests per instance), each predicted at the workload with its capacity within the targets;
and the row the objective prefers, the configured batching giving way only to one predicted
:data:`BATCHING_MARGIN` better.

Pure: the rows' fit (KV space left at that batching) and a hybrid's state cap are handed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config.settings import Settings
from . import predict as pm

BATCHED_TOKENS = (
    2048,
    8192,
    16384,
)  # vLLM's own defaults: A100 and smaller, H100-class API server, large cards


def batching_rows(
    gpu: pm.Gpu,
    shape: pm.ModelShape,
    c: pm.Candidate,
    wl: pm.Workload,
    spec: pm.Speculation | None,
    settings: Settings,
    fits: Callable[[int, int], tuple[bool, int]],
    cap: Callable[[int, int], int | None] | None = None,
) -> list[dict[str, Any]]:
    """The candidate at other batching: ``max_num_batched_tokens`` at vLLM's defaults and the planned
    value, ``max_num_seqs`` halved, planned, doubled and the requests of the workload each instance
    takes; each with the KV space its activations leave (:func:`choose_batching` picks one). ``cap``
    (a hybrid model): the sequences whose recurrent state fits at a batching, what the instance would
    lower ``max_num_seqs`` to (:func:`.engine.state_cap`): a row is predicted as it would run, and
    says what was asked (``asked_max_num_seqs``)."""
    eng = settings.engine
    share = max(1, -(-wl.concurrency // max(1, c.instances)))  # the workload's requests per instance
    out: list[dict[str, Any]] = []
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for asked in sorted(
        {
            max(1, eng.max_num_seqs // 2),
            eng.max_num_seqs,
            min(65_536, eng.max_num_seqs * 2),
            min(65_536, share),
        }
    ):
        for batched in sorted({*BATCHED_TOKENS, eng.max_num_batched_tokens}):
            seqs, state = runs_at(asked, max(batched, asked), cap)
            budget = max(batched, seqs)
            planned = asked == eng.max_num_seqs and batched == eng.max_num_batched_tokens
            if (seqs, budget) in seen:  # two asked values that run alike: one row, the configured one's
                if planned:
                    seen[(seqs, budget)] |= {"planned": True, "asked_max_num_seqs": asked}
                    if asked == seqs:
                        del seen[(seqs, budget)]["asked_max_num_seqs"]
                continue
            ok, kv_tokens = fits(budget, seqs)
            ok = ok and state != 0  # no sequence's state fits: vLLM would not start (engine.state_cap)
            alt = dataclasses.replace(
                c, max_num_seqs=seqs, max_num_batched_tokens=budget, kv_tokens=max(0, kv_tokens)
            )
            row = _row(gpu, shape, alt, wl, spec, settings, ok) | {"planned": planned}
            if seqs != asked:
                row["asked_max_num_seqs"] = asked
            seen[(seqs, budget)] = row
            out.append(row)
    return out


def _row(
    gpu: pm.Gpu,
    shape: pm.ModelShape,
    alt: pm.Candidate,
    wl: pm.Workload,
    spec: pm.Speculation | None,
    settings: Settings,
    ok: bool,
) -> dict[str, Any]:
    """One batching's figures at the workload and its capacity within the targets (0 where it does not
    fit)."""
    lay = settings.layout
    p = pm.predict(gpu, shape, alt, wl, spec, explain=False)  # a row holds the figures alone
    most, at = (
        pm.capacity(gpu, shape, alt, wl, spec, lay.ttft_target_ms, lay.tpot_target_ms) if ok else (0.0, 0)
    )
    return {
        "max_num_seqs": alt.max_num_seqs,
        "max_num_batched_tokens": alt.max_num_batched_tokens,
        "fits": ok,
        "kv_tokens": alt.kv_tokens,
        # requests of the workload's length the cache holds at once, as vLLM's pool keeps them (a
        # sliding-window group holds only the window: plan/predict.py ModelShape.requests_in_kv)
        "kv_requests": shape.requests_in_kv(
            alt.kv_tokens, wl.input_len + wl.output_len, drafted=pm.drafted(spec)
        ),
        "ttft_ms": round(p.ttft_ms, 1),
        "tpot_ms": round(p.tpot_ms, 2),
        "output_tokens_per_s": round(p.output_tokens_per_s, 1),
        "capacity_output_tokens_per_s": round(most, 1),
        "capacity_concurrency": at,
    }


def runs_at(asked: int, budget: int, cap: Callable[[int, int], int | None] | None) -> tuple[int, int | None]:
    """The ``max_num_seqs`` that runs where ``asked`` are (at least one), and the sequences whose recurrent
    state fits at that batching (0: none; None for a model without state, or one that does not fit)."""
    state = cap(budget, asked) if cap is not None else None
    return (asked if state is None else max(1, min(asked, state))), state


# The configured batching gives way only to one predicted this much better (output tokens/s within the
# targets, or a request's time): the model's own error is larger than a few per cent (tests/test_predict.py
# holds it to ±30 % of AIConfigurator), so a smaller gain is no evidence for a change.
BATCHING_MARGIN = 0.10
CAPACITY_TIE = pm.CAPACITY_TIE  # output tokens/s within which two batchings' capacities count as equal


def _request_ms(row: Mapping[str, Any], output_len: int) -> float:
    """One request's predicted time at the workload: TTFT, then (output - 1) tokens at TPOT."""
    return row["ttft_ms"] + (output_len - 1) * row["tpot_ms"]


def _miss(row: Mapping[str, Any], targets: tuple[float, float]) -> float:
    """How far ``row``'s figures at the workload are from the targets (:func:`.predict.target_miss`)."""
    return pm.target_miss(row["ttft_ms"], row["tpot_ms"], targets)


def _better(
    b: Mapping[str, Any],
    planned: Mapping[str, Any],
    objective: str,
    output_len: int,
    targets: tuple[float, float],
) -> bool:
    if objective == "latency":
        return _request_ms(b, output_len) < (1 - BATCHING_MARGIN) * _request_ms(planned, output_len)
    if objective == "closest":
        return _miss(b, targets) < (1 - BATCHING_MARGIN) * _miss(planned, targets)
    return b["capacity_output_tokens_per_s"] > (1 + BATCHING_MARGIN) * planned["capacity_output_tokens_per_s"]


def _closest_row(
    rows: Sequence[Mapping[str, Any]],
    ok: list[int],
    planned: int | None,
    targets: tuple[float, float],
    output_len: int,
    request_tokens: int | None,
) -> tuple[int, str]:
    """Where no row meets the targets at any load: the row :func:`_winning_row` takes, and what it has."""
    ttft_target_ms, tpot_target_ms = targets

    def request_ms(j: int) -> float:
        return _request_ms(rows[j], output_len)

    # none within the targets at any load: the row closest to them at the workload (the farther of its
    # two figures from its target the least), then the shorter request. Not the shortest request alone:
    # where the GPU is the limit every batching's requests take about as long, and the fewer sequences
    # keep that time by making the workload's other requests wait (TTFT of seconds, TPOT within). Rows
    # whose sequences the KV cache cannot hold at the workload's request length come last: their
    # figures assume them all running, where vLLM would preempt
    def overflows(j: int) -> bool:
        if not request_tokens:
            return False
        held = rows[j].get("kv_requests")
        if held is not None:  # as vLLM's pool holds requests of the workload's length
            return bool(rows[j]["max_num_seqs"] > held)
        return bool(rows[j]["max_num_seqs"] * request_tokens > rows[j]["kv_tokens"])

    i = min(
        ok,
        key=lambda j: (
            overflows(j),
            round(_miss(rows[j], targets), 2),
            round(request_ms(j)),
            j != planned,
        ),
    )
    what = (
        f"the figures closest to the targets at the workload (TTFT {rows[i]['ttft_ms']:.0f} ms, TPOT "
        f"{rows[i]['tpot_ms']:.1f} ms: {_miss(rows[i], targets):.1f}x the farther target), as no batching "
        f"meets TTFT <= {ttft_target_ms:g} ms and TPOT <= {tpot_target_ms:g} ms at any load"
    )
    if not overflows(i) and any(overflows(j) for j in ok):
        what += (
            f" (of the batchings whose sequences the KV cache holds at {request_tokens} tokens a request: "
            "more would be preempted)"
        )
    return i, what


def _winning_row(
    rows: Sequence[Mapping[str, Any]],
    ok: list[int],
    planned: int | None,
    objective: str,
    targets: tuple[float, float],
    output_len: int,
    request_tokens: int | None = None,
) -> tuple[int, str, str]:
    """The row the objective prefers among those that fit (``ok``), what it has, and the objective it
    was judged by (``closest`` where no row meets the targets at any load)."""
    ttft_target_ms, tpot_target_ms = targets

    def request_ms(j: int) -> float:
        return _request_ms(rows[j], output_len)

    within = [j for j in ok if rows[j]["capacity_output_tokens_per_s"] > 0]
    if objective == "latency":
        i = min(ok, key=lambda j: (round(request_ms(j)), j != planned))
        what = (
            f"the shortest predicted request ({request_ms(i) / 1e3:.2f} s: TTFT {rows[i]['ttft_ms']:.0f} ms, "
            f"TPOT {rows[i]['tpot_ms']:.1f} ms)"
        )
        return i, what, objective
    if not within:
        i, what = _closest_row(rows, ok, planned, targets, output_len, request_tokens)
        return i, what, "closest"

    # capacities within CAPACITY_TIE of the most are equal: the configured row, then the row within the
    # targets at the workload itself, then the shorter request there (a smaller max_num_seqs lowers TPOT
    # only by making the requests beyond it wait: its TTFT, not its throughput, pays)
    def at_workload(j: int) -> bool:
        return bool(rows[j]["ttft_ms"] <= ttft_target_ms and rows[j]["tpot_ms"] <= tpot_target_ms)

    best = max(rows[j]["capacity_output_tokens_per_s"] for j in within)
    tied = [j for j in within if rows[j]["capacity_output_tokens_per_s"] >= best - CAPACITY_TIE]
    i = max(
        tied,
        key=lambda j: (
            j == planned,
            at_workload(j),
            -round(request_ms(j), 1),
            rows[j]["capacity_output_tokens_per_s"],
        ),
    )
    what = (
        f"the most output tokens/s within TTFT <= {ttft_target_ms:g} ms and TPOT <= {tpot_target_ms:g} ms "
        f"({rows[i]['capacity_output_tokens_per_s']:.0f} at {rows[i]['capacity_concurrency']} requests)"
    )
    return i, what, objective


def _configured_was(was: Mapping[str, Any], ttft_target_ms: float, tpot_target_ms: float) -> str:
    """What the configured batching's row predicts at the workload: its figures may miss the targets,
    said so, never called within them."""
    missed = [f"TTFT over {ttft_target_ms:g} ms"] * (was["ttft_ms"] > ttft_target_ms) + [
        f"TPOT over {tpot_target_ms:g} ms"
    ] * (was["tpot_ms"] > tpot_target_ms)
    held = (
        f"{was['capacity_output_tokens_per_s']:.0f} tok/s within the targets at "
        f"{was['capacity_concurrency']} requests"
        if was["capacity_output_tokens_per_s"] > 0
        else "no load within the targets"
    )
    seqs = (
        f"{was['asked_max_num_seqs']} ({was['max_num_seqs']} whose recurrent state fits)"
        if "asked_max_num_seqs" in was
        else was["max_num_seqs"]
    )
    return (
        f"; configured max_num_seqs {seqs}, max_num_batched_tokens {was['max_num_batched_tokens']}: "
        f"TTFT {was['ttft_ms']:.0f} ms, TPOT {was['tpot_ms']:.1f} ms at the workload"
        + (f" ({', '.join(missed)})" if missed else "")
        + f"; {held}"
    )


def choose_batching(
    rows: Sequence[Mapping[str, Any]],
    objective: str,
    ttft_target_ms: float,
    tpot_target_ms: float,
    output_len: int,
    request_tokens: int | None = None,
) -> tuple[int, str]:
    """The index of the batching row (:func:`batching_rows`) the objective prefers, and why; -1 with the
    reason where the planned row stays. ``throughput``: the most output tokens/s sustained within the
    targets, and where no row meets them at any load, the row closest to them at the workload
    (:func:`_miss`; rows whose ``max_num_seqs`` the KV cache cannot hold at ``request_tokens`` a request
    last), then the shorter request; ``latency``: the shortest request at
    the workload (TTFT + (output - 1) x TPOT: fewer sequences lower TPOT only by making requests
    wait). A row that does not fit never wins; the planned row stays unless the winner is predicted
    :data:`BATCHING_MARGIN` better."""
    ok = [i for i, b in enumerate(rows) if b["fits"]]
    planned = next((i for i, b in enumerate(rows) if b["planned"]), None)
    if not ok:
        return -1, "no batching fits"
    i, what, by = _winning_row(
        rows, ok, planned, objective, (ttft_target_ms, tpot_target_ms), output_len, request_tokens
    )
    b = rows[i]
    if i == planned:
        return -1, f"objective {objective}: the configured batching has {what}"
    if (
        planned is not None
        and rows[planned]["fits"]
        and not _better(b, rows[planned], by, output_len, (ttft_target_ms, tpot_target_ms))
    ):
        return -1, (
            f"objective {objective}: max_num_seqs {b['max_num_seqs']}, max_num_batched_tokens "
            f"{b['max_num_batched_tokens']} are predicted less than {BATCHING_MARGIN:.0%} better "
            "than the configured batching, which stays"
        )
    was = rows[planned] if planned is not None else None
    then = _configured_was(was, ttft_target_ms, tpot_target_ms) if was else ""
    capped = (
        f" (of {b['asked_max_num_seqs']} tried, the recurrent state of {b['max_num_seqs']} fits)"
        if "asked_max_num_seqs" in b
        else ""
    )
    return i, (
        f"objective {objective}: max_num_seqs {b['max_num_seqs']}{capped}, max_num_batched_tokens "
        f"{b['max_num_batched_tokens']} have {what}{then}"
    )
