"""Greedy answers of a baseline and a candidate, compared token by token (pure: no I/O).

Per prompt: exact match of the generated token ids, the first position where they differ (both
token ids, their text where a decoder is given, and how the baseline itself ranked the candidate's
token there when the baseline's top log-probabilities are known), and a similarity.

The similarity (:data:`SIMILARITY`) is ``difflib.SequenceMatcher(None, baseline_ids, candidate_ids,
autojunk=False).ratio()`` over the generated token ids: ``2·M / (len(baseline) + len(candidate))``
with ``M`` the tokens in matching blocks (1.0 when both are empty). ``autojunk`` is off because
with it on, any token making up more than 1 % of a sequence of 200 or more tokens is ignored, so the
score would depend on the answer's length. The run's similarity is the mean over prompts, each
prompt weighing the same; it passes when that mean reaches the bar (``verify.min_similarity``).
Token ids, not text: two servers of the same model share one tokenizer, and ids see a difference
that decodes to the same text."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .prompts import Prompt

SIMILARITY = "token_sequence_ratio"
SIMILARITY_DESCRIPTION = (
    "difflib.SequenceMatcher(None, baseline_ids, candidate_ids, autojunk=False).ratio() over the "
    "generated token ids of each prompt (2*M/T: M tokens in matching blocks, T both lengths summed; "
    "1.0 when both are empty), mean over prompts"
)


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one server generated for one prompt. ``top_logprobs``: per generated position, token id →
    log-probability of the most likely tokens there (asked of the baseline only; None without)."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    top_logprobs: tuple[Mapping[int, float], ...] | None = None


@dataclasses.dataclass(frozen=True)
class Token:
    """One side's token at a divergence; ``token_id`` None where that answer had already ended."""

    token_id: int | None
    text: str | None


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first position where the two answers differ. ``baseline_logprob``: the baseline's
    log-probability of its own token there; ``candidate_logprob`` and ``candidate_rank`` (1 = the
    baseline's own choice): how the baseline rated the candidate's token there, None where it was not
    among the baseline's top tokens (or no log-probabilities were returned)."""

    index: int
    baseline: Token
    candidate: Token
    baseline_logprob: float | None = None
    candidate_logprob: float | None = None
    candidate_rank: int | None = None

    @property
    def margin(self) -> float | None:
        """How much more likely the baseline found its own token (nats); near 0: a near-tie."""
        if self.baseline_logprob is None or self.candidate_logprob is None:
            return None
        return self.baseline_logprob - self.candidate_logprob


@dataclasses.dataclass(frozen=True)
class PromptResult:
    id: str
    kind: str
    exact: bool
    similarity: float
    baseline_tokens: int
    candidate_tokens: int
    baseline_finish: str | None
    candidate_finish: str | None
    divergence: Divergence | None


@dataclasses.dataclass(frozen=True)
class Verdict:
    results: tuple[PromptResult, ...]
    min_similarity: float

    @property
    def prompts(self) -> int:
        return len(self.results)

    @property
    def exact_matches(self) -> int:
        return sum(r.exact for r in self.results)

    @property
    def exact_match_rate(self) -> float:
        return self.exact_matches / self.prompts if self.results else 0.0

    @property
    def similarity(self) -> float:
        """The mean of the per-prompt similarities (0.0 with no prompt: nothing was shown equal)."""
        return sum(r.similarity for r in self.results) / self.prompts if self.results else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.results) and self.similarity >= self.min_similarity

    def by_kind(self) -> dict[str, dict[str, float | int]]:
        """Per prompt kind: prompts, exact matches, mean similarity (kinds in first-seen order)."""
        out: dict[str, list[PromptResult]] = {}
        for r in self.results:
            out.setdefault(r.kind, []).append(r)
        return {
            k: {
                "prompts": len(rs),
                "exact_matches": sum(r.exact for r in rs),
                "similarity": sum(r.similarity for r in rs) / len(rs),
            }
            for k, rs in out.items()
        }


def similarity(a: Sequence[int], b: Sequence[int]) -> float:
    """:data:`SIMILARITY` of two token id sequences (1.0 when both are empty)."""
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, list(a), list(b), autojunk=False).ratio()


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length when one is a prefix of
    the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(
    baseline: Answer, candidate: Answer, decode: Callable[[int], str | None] | None = None
) -> Divergence | None:
    """Where ``candidate`` first leaves ``baseline`` (None when the token ids are equal)."""
    i = first_difference(baseline.token_ids, candidate.token_ids)
    if i is None:
        return None

    def token(ids: tuple[int, ...]) -> Token:
        if i >= len(ids):
            return Token(None, None)
        return Token(ids[i], decode(ids[i]) if decode else None)

    b, c = token(baseline.token_ids), token(candidate.token_ids)
    top = baseline.top_logprobs[i] if baseline.top_logprobs and i < len(baseline.top_logprobs) else None
    b_lp = c_lp = rank = None
    if top:
        b_lp = top.get(b.token_id) if b.token_id is not None else None
        if c.token_id is not None and c.token_id in top:
            c_lp = top[c.token_id]
            rank = 1 + sum(1 for lp in top.values() if lp > c_lp)
    return Divergence(i, b, c, b_lp, c_lp, rank)


def compare(
    prompts: Sequence[Prompt],
    baseline: Sequence[Answer],
    candidate: Sequence[Answer],
    min_similarity: float,
    decode: Callable[[int], str | None] | None = None,
) -> Verdict:
    """The verdict over ``prompts`` (answers in the same order); ``decode`` turns a token id into
    its text for the divergences (optional)."""
    if not (len(prompts) == len(baseline) == len(candidate)):
        raise ValueError(
            f"{len(prompts)} prompts, {len(baseline)} baseline and {len(candidate)} candidate answers"
        )
    results = []
    for p, b, c in zip(prompts, baseline, candidate, strict=True):
        d = divergence(b, c, decode)
        results.append(
            PromptResult(
                id=p.id,
                kind=p.kind,
                exact=d is None,
                similarity=similarity(b.token_ids, c.token_ids),
                baseline_tokens=len(b.token_ids),
                candidate_tokens=len(c.token_ids),
                baseline_finish=b.finish_reason,
                candidate_finish=c.finish_reason,
                divergence=d,
            )
        )
    return Verdict(tuple(results), min_similarity)
