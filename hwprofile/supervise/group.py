"""A headless node of a multi-node vLLM group, and node 0 as it sees it.

What real vLLM (0.32, ``--nnodes 2``, mp backend, measured on CPU) does when one member goes:

- a headless node's workers die: node 0's ``/health`` stays 200; its engine only finds out at its
  next step (a request answered 500, ``EngineDeadError``), and then its API server exits (code 0);
- node 0 dies: the headless node's processes stay alive, joined to nothing;
- a headless process started while node 0 serves a group joins nothing either: the group was formed
  without it, and it waits at the rendezvous for good.

So a headless node is not "ready" because node 0 answers: it is ready when node 0 answers *and*
node 0's API server is not the one that was already serving when this node's process started (its
``process_start_time_seconds``, on ``/metrics``, tells the one from the other). When it was, the
group lost this node before: :func:`judge` asks for one probe (a one-token completion, so node 0's
engine takes a step and finds its member gone), and once node 0 stops answering for it, a new
process (it joins node 0's next group). The judgement is pure; :func:`look` and :func:`probe` are
its only I/O.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..telemetry import http
from ..telemetry.metrics import start_time

log = logging.getLogger("hwprofile")


@dataclass(frozen=True)
class Head:
    """Node 0 as one look saw it: whether ``/health`` said 200, and when its API server started
    (``process_start_time_seconds``; None when nothing said)."""

    answers: bool
    started: float | None = None


@dataclass(frozen=True)
class Verdict:
    """What a headless node waiting to be ready does now: ``ready``, ``probe`` (node 0 serves a
    group this process is not in: make it find out), ``rejoin`` (node 0 serves no group this process
    can still join: start a new one), or wait; ``why`` says which."""

    ready: bool = False
    probe: bool = False
    rejoin: bool = False
    why: str = ""


def judge(at_start: Head | None, now: Head) -> Verdict:
    """Decide for a headless process started when node 0 looked like ``at_start`` (None: not looked
    at) and looks like ``now``."""
    stale = at_start is not None and at_start.answers  # node 0 already served a group without us
    if not stale:
        if now.answers:
            return Verdict(ready=True, why="node 0 answers: the group formed with this node")
        return Verdict(why="waiting for node 0 to form the group")
    assert at_start is not None
    if not now.answers:
        return Verdict(rejoin=True, why="node 0's old group has ended: a new process joins its next one")
    if now.started is not None and at_start.started is not None and now.started != at_start.started:
        return Verdict(ready=True, why="node 0 started again and answers: the group formed with this node")
    return Verdict(
        probe=True,
        why="node 0 serves a group formed before this node's process started (without it); "
        "it finds out at its next request",
    )


def look(url: str, timeout: float = 2.0) -> Head:
    """Node 0 at ``url`` now (``/health``, then ``/metrics`` for its start time)."""
    got = http.get(url + "/health", timeout)
    if got is None or got[0] != 200:
        return Head(False)
    metrics = http.get(url + "/metrics", timeout)
    started = start_time(metrics[1].decode("utf-8", "replace")) if metrics and metrics[0] == 200 else None
    return Head(True, started)


def probe(url: str, api_key: str | None, timeout: float = 30.0) -> str:
    """One greedy one-token completion to node 0 (the model it lists first), so that its engine takes
    a step and finds a member gone; what came back, in words (never raises)."""
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        status, data = http.request(url + "/v1/models", headers=headers, timeout=timeout)
        models = json.loads(data)["data"] if status == 200 else []
        if not models:
            return f"no model listed at /v1/models (HTTP {status})"
        body = {"model": models[0]["id"], "prompt": "ping", "max_tokens": 1, "temperature": 0}
        status, data = http.request(
            url + "/v1/completions",
            "POST",
            json.dumps(body).encode(),
            {**headers, "Content-Type": "application/json"},
            timeout,
        )
        return f"HTTP {status}"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"{type(e).__name__}: {e}"[:200]
