"""What a failed start means (from vLLM's own log), and the ladder that answers memory failures.

Pure functions: log text in, a kind out; a planned instance and the steps taken in, the next step
out, as a settings override the supervisor re-plans with."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from ..plan.types import InstancePlan


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


# uvicorn's line once vLLM's API server serves: a server that printed it had started, whether or
# not its supervisor's readiness check got an answer before it went
_STARTED = re.compile(r"^.*Application startup complete\.?\s*$", re.M)


def classify(log_text: str) -> Failure:
    """What a server that exited before its supervisor saw it ready died of: a known message, else
    (its log says it had finished starting) an unplanned exit, else unknown."""
    for kind, memory, retry, rx in PATTERNS:
        m = rx.search(log_text)
        if m:
            return Failure(kind, memory, retry, _line_of(log_text, m.start()))
    started = _STARTED.search(log_text)
    if started:
        return Failure(
            "unplanned exit",
            False,
            True,
            exit_evidence(log_text[started.end() :]) or started.group(0).strip(),
        )
    return Failure("unknown", False, True, telling_line(log_text) or "(empty log)")


# A line that says something went wrong: an exception's last line (``ValueError: ...``), a log line at
# ERROR or worse, the kernel's or the shell's words for a killed process.
_TELLING = re.compile(
    r"^(?:[\w.]*(?:Error|Exception|Exit|Interrupt)\b:?.*"
    r"|.*\b(?:ERROR|CRITICAL|FATAL)\b.*|.*\b(?:Killed|Segmentation fault|core dumped|Aborted)\b.*)$"
)


def telling_line(log_text: str, scan: int = 200) -> str | None:
    """The line of a log's last ``scan`` lines that best says why it ended: the last one that says
    something went wrong (an exception, an error, a kill), else the last line; None for an empty log."""
    lines = [ln.strip() for ln in log_text[-200_000:].splitlines() if ln.strip()][-scan:]
    if not lines:
        return None
    found = next((ln for ln in reversed(lines) if _TELLING.match(ln)), None)
    return (found or lines[-1])[:300]


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)].strip()


class Rung(NamedTuple):
    """One ladder step as a settings override: the supervisor re-plans with it (and every step
    taken before), so the instance it starts next is planned, memory figures included."""

    rung: str  # one of RUNGS
    set: str  # the override, as --set takes it: "engine.max_model_len=512"
    change: str  # human readable: what changes, from what to what


RUNGS = ("memory share", "context length", "concurrent sequences", "eager mode", "speculative decoding")
MIN_UTILIZATION = 0.5
MIN_CONTEXT = 256  # the context floor when the profile's engine.min_model_len is not known
UTILIZATION_STEP = 0.05
ROUND = 128  # context steps stay whole multiples of vLLM's largest default block


def _candidate(rung: str, inst: InstancePlan, min_model_len: int) -> Rung | None:
    """The override of ``rung`` one step below ``inst``, or None when that rung is at its bottom."""
    e = inst.engine
    if rung == "memory share":
        util = e.gpu_memory_utilization
        if inst.device != "cuda" or util is None:
            return None
        lower = round(float(util) - UTILIZATION_STEP, 3)
        if lower < MIN_UTILIZATION - 1e-9:
            return None
        return Rung(
            rung, f"engine.gpu_memory_utilization={lower:g}", f"gpu_memory_utilization {util} -> {lower:g}"
        )
    if rung == "context length":
        length = int(e.max_model_len)
        half = length // 2
        shorter = max(int(min_model_len), half // ROUND * ROUND or half)
        if shorter >= length:
            return None
        return Rung(rung, f"engine.max_model_len={shorter}", f"max_model_len {length} -> {shorter}")
    if rung == "concurrent sequences":
        seqs = int(e.max_num_seqs)
        if seqs <= 1:
            return None
        return Rung(rung, f"engine.max_num_seqs={seqs // 2}", f"max_num_seqs {seqs} -> {seqs // 2}")
    if rung == "eager mode":
        if e.enforce_eager:
            return None
        return Rung(
            rung, "engine.enforce_eager=true", "enforce_eager false -> true (no CUDA graph or compile memory)"
        )
    if rung == "speculative decoding":
        spec = inst.speculative
        if not spec:
            return None
        return Rung(
            rung,
            "speculative.method=none",
            f"{spec.method} speculation dropped (draft weights and KV freed)",
        )
    raise ValueError(f"unknown ladder rung {rung!r}")


def next_rung(inst: InstancePlan, taken: Sequence[Rung], min_model_len: int) -> Rung | None:
    """The next ladder step for ``inst`` (the instance as planned with the steps ``taken`` so far,
    tried or refused) after a memory-like failure, or None at the bottom. Pure: data in, override out.

    Rungs, in order (:data:`RUNGS`): lower the memory share by 0.05 (GPU, not below 0.5), halve the
    context (never below ``min_model_len``, the profile's ``engine.min_model_len``), halve concurrent
    sequences, eager mode (no CUDA graphs, no torch.compile), no speculative decoding. Each rung is
    taken one step at a time, again while it can still go lower; the ladder never climbs back to an
    earlier rung, and an override already taken (one the re-plan did not follow) is not taken again.
    """
    tried = {r.set for r in taken}
    start = max((RUNGS.index(r.rung) for r in taken), default=0)
    for rung in RUNGS[start:]:
        step = _candidate(rung, inst, min_model_len)
        if step is not None and step.set not in tried:
            return step
    return None


def ladder_sets(taken: Sequence[Rung]) -> list[str]:
    """The overrides for a re-plan with every step in ``taken`` (a later one of a key wins)."""
    return [r.set for r in taken]


_DEATH = re.compile(r"(Engine core proc \S+ died[^\n]*|EngineDeadError[^\n]*|RuntimeError: Engine[^\n]*)")


def exit_evidence(log_text: str) -> str | None:
    """The line of a running server's log that says why it left (an engine rank that died: a
    data-parallel server ends with one), else the last line that says something went wrong
    (:func:`telling_line`), else None (the caller falls back to the last line)."""
    found = _DEATH.findall(log_text[-200_000:])
    return found[-1][:300] if found else telling_line(log_text)
