"""What a failed start means (from vLLM's own log), and the ladder that answers memory failures.

Pure functions: log text in, a kind out; a planned instance in, the next, smaller one out."""

from __future__ import annotations

import copy
import re
from typing import Any, NamedTuple


class Failure(NamedTuple):
    kind: str  # see PATTERNS
    memory_like: bool  # answered by the ladder
    retry: bool  # worth starting again at all
    evidence: str  # the log line that told


# First match wins; patterns are vLLM's (and PyTorch's, uvicorn's) own messages.
PATTERNS: list[tuple[str, bool, bool, re.Pattern[str]]] = [
    (
        "free memory below the requested share",
        True,
        True,
        re.compile(
            r"Free memory on device .* is less than desired GPU memory utilization|less than desired GPU memory utilization",
            re.I,
        ),
    ),
    (
        "no memory left for the KV cache",
        True,
        True,
        re.compile(
            r"No available memory for the cache blocks|larger than the available KV cache memory|Insufficient memory .*KV cache|KV cache is needed, which is larger than",
            re.I,
        ),
    ),
    (
        "out of memory",
        True,
        True,
        re.compile(
            r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|out of memory|Cannot allocate memory",
            re.I,
        ),
    ),
    (
        "unknown flag",
        False,
        False,
        re.compile(r"unrecognized arguments: .*|error: argument [^\n]*|invalid choice: .*", re.I),
    ),
    (
        "missing model",
        False,
        False,
        re.compile(
            r"HFValidationError.*|Invalid repository ID or local directory.*|does not appear to have a file named config\.json.*|No such file or directory: .*config\.json.*|RepositoryNotFoundError.*",
            re.I,
        ),
    ),
    ("port in use", False, False, re.compile(r"\[Errno 98\][^\n]*|address already in use[^\n]*", re.I)),
    (
        "unsupported head size",
        False,
        False,
        re.compile(
            r"[Hh]ead size \d+ is not supported[^\n]*|Unsupported head size[^\n]*|head_size[^\n]*not supported[^\n]*"
        ),
    ),
]


def classify(log_text: str) -> Failure:
    for kind, memory, retry, rx in PATTERNS:
        m = rx.search(log_text)
        if m:
            return Failure(kind, memory, retry, _line_of(log_text, m.start()))
    tail = [ln for ln in log_text.strip().splitlines() if ln.strip()][-1:] or ["(empty log)"]
    return Failure("unknown", False, True, tail[0].strip())


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()


class Step(NamedTuple):
    rung: str
    change: str  # human readable: what changed, from what to what


MIN_UTILIZATION = 0.5
MIN_CONTEXT = 256
ROUND = 128  # context steps stay whole multiples of vLLM's largest default block


def next_step(inst: dict[str, Any]) -> tuple[dict[str, Any], Step] | None:
    """The next rung down from ``inst`` after a memory-like failure, or None at the bottom.

    Rungs, in order, each taken one step at a time and again while it still can go lower:
    lower the memory share (GPU), halve the context, halve concurrent sequences, eager mode
    (no CUDA graphs, no torch.compile), drop speculative decoding.
    """
    new = copy.deepcopy(inst)
    e = new["engine"]
    util = e.get("gpu_memory_utilization")
    if new.get("device") == "cuda" and util is not None and util - 0.05 >= MIN_UTILIZATION - 1e-9:
        e["gpu_memory_utilization"] = round(util - 0.05, 3)
        return new, Step("memory share", f"gpu_memory_utilization {util} -> {e['gpu_memory_utilization']}")
    length = int(e["max_model_len"])
    if length > MIN_CONTEXT:
        shorter = max(MIN_CONTEXT, (length // 2) // ROUND * ROUND or MIN_CONTEXT)
        e["max_model_len"] = shorter
        e["max_num_batched_tokens"] = (
            max(int(e["max_num_batched_tokens"]), int(e["max_num_seqs"]))
            if e.get("enable_chunked_prefill", True)
            else max(shorter, int(e["max_num_seqs"]))
        )
        return new, Step("context length", f"max_model_len {length} -> {shorter}")
    seqs = int(e["max_num_seqs"])
    if seqs > 1:
        e["max_num_seqs"] = max(1, seqs // 2)
        return new, Step("concurrent sequences", f"max_num_seqs {seqs} -> {e['max_num_seqs']}")
    if not e.get("enforce_eager"):
        e["enforce_eager"] = True
        return new, Step("eager mode", "enforce_eager false -> true (no CUDA graph or compile memory)")
    if new.get("speculative"):
        method = new["speculative"]["method"]
        new["speculative"] = None
        return new, Step("speculative decoding", f"{method} speculation dropped (draft weights and KV freed)")
    return None
