"""k advice for a plan from a running server's own counters (``hwprofile plan --advice-from URL``):
one scrape, the counters since the server started as the window, the same pure advice the daemon
gives, turned into the setting that applies it."""

from __future__ import annotations

from collections.abc import Mapping

from ..config.settings import Watch
from ..daemon.policy import KAdvice, SpecWindow, advise_k
from ..errors import OperationError
from ..plan.speculative import draft_cost
from ..plan.types import Plan
from ..telemetry.metrics import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS
from ..telemetry.scrape import scrape


class AdviceError(OperationError, ValueError):
    """No advice can be had from that server; the message says why."""


def lifetime_window(counters: Mapping[str, float]) -> SpecWindow | None:
    if DRAFTS not in counters:
        return None
    keys = sorted(
        (k for k in counters if k.startswith(PER_POS)), key=lambda k: int(k.rsplit("=", 1)[1].rstrip("}"))
    )
    return SpecWindow(
        counters[DRAFTS],
        counters.get(DRAFT_TOKENS, 0.0),
        counters.get(ACCEPTED, 0.0),
        tuple(counters[k] for k in keys),
    )


def advice_from(url: str, plan: Plan, settings: Watch) -> tuple[KAdvice, list[str]]:
    """The advice for ``plan``'s first speculating instance from the server at ``url``, and the
    ``--set`` overrides that apply it."""
    r = scrape("advice", url, 0.0, timeout=5.0)
    if r.status != "ok" or r.metrics is None:
        raise AdviceError(f"--advice-from {url}: {r.error or r.status}")
    w = lifetime_window(r.metrics.counters)
    if w is None:
        raise AdviceError(f"--advice-from {url}: the server does not speculate (no spec_decode_* counters)")
    inst = next((i for i in plan.instances if i.speculative), None)
    if inst is None or inst.speculative is None:
        raise AdviceError("--advice-from: this plan does not speculate (speculative.method is none)")
    spec = inst.speculative
    cost = draft_cost(plan, inst)
    seqs = inst.engine.max_num_seqs
    load = (r.metrics.running or 0.0) / seqs
    a = advise_k(w, int(spec.num_speculative_tokens), cost, load, settings)
    if a is None:
        raise AdviceError(
            f"--advice-from {url}: {w.draft_tokens:.0f} draft tokens so far, fewer than "
            f"watch.min_draft_tokens ({settings.min_draft_tokens}): send it traffic first"
        )
    sets = ["speculative.method=none"] if a.k == 0 else [f"speculative.num_speculative_tokens={a.k}"]
    if a.k and spec.num_speculative_tokens_per_batch_size:  # ABSENT is falsy
        sets.append("speculative.by_batch_size=null")  # one advised k replaces the table
    return a, sets
