"""Greedy answers from a running vLLM server, one request at a time.

Every request is ``POST /v1/completions`` with the prompt as raw text (no chat template), ``temperature
0``, a fixed ``seed``, ``max_tokens`` and ``return_token_ids`` (vLLM 0.32 returns the generated ids
with it). Requests go one after the other, never concurrently, so that batching with other requests
cannot change the numbers a server computes. The baseline is also asked for the top log-probabilities
of each position (``logprobs`` with ``return_tokens_as_token_ids``), so that a divergence can say how
the baseline itself rated the candidate's token; the candidate is asked exactly what a client would
ask. Loopback HTTP never goes through a proxy (:mod:`hwprofile.supervise.http`)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OperationError
from ..release import CPU_BUILD, short
from ..telemetry.http import HttpError, get, post_json
from .compare import Answer
from .prompts import Prompt

SEED = 0
TOP_LOGPROBS = 5
ENDPOINT = "/v1/completions"


class VerifyError(OperationError):
    """A server did not answer as needed (the message names the server, the request and its reply)."""


def served_model(url: str, timeout: float = 10.0) -> str:
    """The first model a running server lists under ``/v1/models`` (what requests must name)."""
    got = get(url.rstrip("/") + "/v1/models", timeout)
    if got is None:
        raise VerifyError(f"{url}: nothing answered at /v1/models; is a vLLM server running there?")
    status, body = got
    try:
        models = json.loads(body)["data"]
        return str(models[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise VerifyError(f"{url}/v1/models: HTTP {status}, no model listed: {body[:200]!r}") from None


def _http_detail(e: HttpError) -> str:
    return e.body[:500].decode("utf-8", "replace")


def _top_logprobs(choice: dict[str, Any]) -> tuple[dict[int, float], ...] | None:
    """``choices[0].logprobs.top_logprobs`` with ``token_id:N`` keys as ``{N: logprob}`` per position;
    None when absent or keyed by text (a server that ignored ``return_tokens_as_token_ids``)."""
    lp = choice.get("logprobs")
    tops = lp.get("top_logprobs") if isinstance(lp, dict) else None
    if not isinstance(tops, list):
        return None
    out: list[dict[int, float]] = []
    for step in tops:
        if step is None:
            step = {}
        if not isinstance(step, dict):
            return None  # not vLLM's shape (a list, a number): no log-probabilities, not a traceback
        ids: dict[int, float] = {}
        for key, value in step.items():
            if not (isinstance(key, str) and key.startswith("token_id:")):
                return None
            digits = key[len("token_id:") :]
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 12):
                return None
            if type(value) not in (int, float) or math.isnan(value) or value > 0:
                return None  # a log-probability is a number at most 0 (-inf: impossible)
            ids[int(digits)] = float(value)
        out.append(ids)
    return tuple(out)


class Client:
    """One server: its URL, the model name requests carry, and the request settings."""

    def __init__(
        self,
        url: str,
        model: str,
        max_tokens: int,
        seed: int = SEED,
        logprobs: int | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.max_tokens = max_tokens
        self.seed = seed
        self.logprobs = logprobs
        self.timeout = timeout
        self.notes: list[str] = []
        self._texts: dict[int, str | None] = {}

    def request(self, prompt: str) -> dict[str, Any]:
        """The body of one greedy request for ``prompt``."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "return_token_ids": True,
        }
        if self.logprobs:
            body["logprobs"] = self.logprobs
            body["return_tokens_as_token_ids"] = True
        return body

    def answer(self, prompt: Prompt) -> Answer:
        """The server's greedy answer to ``prompt``."""
        try:
            reply = post_json(self.url.rstrip("/") + ENDPOINT, self.request(prompt.text), self.timeout)
        except HttpError as e:
            detail = _http_detail(e)
            if self.logprobs and e.status == 400:  # a server that refuses log-probabilities: ask without
                self.notes.append(f"{self.url} refused logprobs ({detail[:200]}); asked without them")
                self.logprobs = None
                return self.answer(prompt)
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): HTTP {e.status}: {detail}"
            ) from None
        except (OSError, ValueError) as e:
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): {getattr(e, 'reason', e)}"
            ) from None
        choices = reply.get("choices") if isinstance(reply, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): no choice object in the reply: {str(reply)[:300]}"
            )
        ids = choice.get("token_ids")
        text = choice.get("text")
        if not isinstance(text, str | None):
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): choices[0].text is not text: {text!r:.100}"
            )
        text = text or ""
        finish = choice.get("finish_reason")
        if not isinstance(finish, str | None):
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): choices[0].finish_reason is not text"
            )
        if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < 2**40 for i in ids):
            raise VerifyError(
                f"{self.url}{ENDPOINT} (prompt {prompt.id}): the reply has no generated token ids; "
                "hwprofile verify needs a vLLM that returns them with return_token_ids "
                f"(vLLM {short(CPU_BUILD)} does)"
            )
        return Answer(tuple(ids), text, finish, _top_logprobs(choice))

    def answers(
        self, prompts: Sequence[Prompt], progress: Callable[[str], None] | None = None, label: str = ""
    ) -> tuple[list[Answer], float]:
        """Every prompt's answer, one request at a time, and the seconds it took."""
        t0 = time.monotonic()
        out = []
        for n, p in enumerate(prompts, 1):
            out.append(self.answer(p))
            if progress and (n % 10 == 0 or n == len(prompts)):
                progress(f"{label}: {n}/{len(prompts)} prompts answered ({time.monotonic() - t0:.0f} s)")
        return out, time.monotonic() - t0

    def decode(self, token_id: int) -> str | None:
        """The text of one token through the server's ``/detokenize`` (None where it has none)."""
        if token_id not in self._texts:
            try:
                reply = post_json(
                    self.url.rstrip("/") + "/detokenize", {"model": self.model, "tokens": [token_id]}, 30.0
                )
                text = reply.get("prompt")
                self._texts[token_id] = text if isinstance(text, str) else None
            except (OSError, ValueError, AttributeError):
                self._texts[token_id] = None
        return self._texts[token_id]
