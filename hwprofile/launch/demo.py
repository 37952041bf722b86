"""``hwprofile launch --demo``: the tiny model served for real, one greedy completion through it,
what came back, a clean stop, and what to run next."""

from __future__ import annotations

import sys
import time
from typing import Any

from ..runtime.processes import pid_alive
from .start import Launch, serving
from .status import format_status, status


def demo_completion(
    url: str, model: str, prompt: str = "hwprofile plans vLLM launches", max_tokens: int = 16
) -> dict[str, Any]:
    """One greedy completion; with ``return_token_ids`` (vLLM 0.32 has it) the reply carries the
    prompt's and the generated token ids (``choices[0].prompt_token_ids``, ``.token_ids``); a reply
    without them is shown without ids. The prompt is added to the reply as ``prompt``."""
    from ..telemetry.http import post_json

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    reply = post_json(url + "/v1/completions", body, timeout=120)
    reply["prompt"] = prompt
    return reply


def say(text: str) -> None:
    print(f"hwprofile: demo: {text}")


def run_demo(launch: Launch) -> int:
    """Serve ``launch``, send one completion, show it, stop; exit 1 when something is left running."""
    t0 = time.monotonic()
    pids: list[int | None] = []
    with serving(launch) as sup:
        inst = sup.instances[0]
        pids = [i.pid for i in sup.instances]
        say(f"{inst.name} ready at {inst.url} after {time.monotonic() - t0:.0f} s")
        reply = demo_completion(inst.url, launch.plan.model.path or launch.plan.model.name)
        choice = reply["choices"][0]
        prompt_ids, ids = choice.get("prompt_token_ids"), choice.get("token_ids")
        say(
            f"prompt: {reply['prompt']!r}"
            + (f" ({len(prompt_ids)} tokens: {prompt_ids})" if prompt_ids else "")
        )
        n = reply["usage"]["completion_tokens"]
        say(
            f"generated {n} tokens: {ids}"
            if ids is not None
            else f"generated {n} tokens (this vLLM does not return token ids)"
        )
        say(f"decoded text: {choice['text']!r}")
        say(
            "the tiny model's weights are random by design (made offline, nothing downloaded): the text is "
            "gibberish on purpose; what counts is that a real vLLM served a real request"
        )
        print(format_status(status(launch.runtime)), end="")
    left = [p for p in pids if p and pid_alive(p)]
    say(f"stopped cleanly{'' if not left else f'; still running: {left}'}")
    if left:
        return 1
    print(
        "hwprofile: demo: next, on a GPU host: pip install '.[vllm]' (in the clone), then "
        "`hwprofile plan --model NAME --explain` (the plan, how fast, and why; --explain=all: every value's reason) and "
        "`hwprofile launch --model NAME` (NAME: a local model directory or a Hugging Face model name)",
        file=sys.stdout,
    )
    return 0
