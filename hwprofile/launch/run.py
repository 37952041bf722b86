"""Running a plan: supervised here in the foreground (until a signal), or by a detached supervisor
this waits for until every instance is ready or one failed; and the demo's one completion."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..plan.types import Plan
from ..runtime.dirs import UnsafeDirectory, private_dir
from ..supervise.state import LAST_FILE, STATE_FILE, AlreadySupervising, read_state
from .prepare import log, options
from .status import format_status, status


def run_foreground(
    plan: Plan,
    rel: Any,
    vllm_cmd: str,
    numactl: str | None,
    tmpfs: str | None,
    runtime: Path,
    replan: Callable[[list[str]], Plan] | None = None,
    min_model_len: int | None = None,
) -> int:
    """Supervise ``plan`` here until SIGTERM/SIGINT/SIGHUP; ``replan`` (from the plan's inputs) is
    how the memory ladder's steps are planned."""
    from ..supervise.lifecycle import State
    from ..supervise.supervisor import Supervisor

    try:
        opts = options(
            plan, tmpfs, runtime, progress=lambda m: log.info("%s", m), min_model_len=min_model_len
        )
        sup = Supervisor(plan, rel, vllm_cmd, numactl, opts, replan=replan)
    except AlreadySupervising as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return 2
    except UnsafeDirectory as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return 1

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping instances", signal.Signals(signum).name)
        sup.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    sup.start()
    while not sup.all_done:
        time.sleep(0.3)
    sup.close()  # the last instance thread closed already; this covers a supervisor with none
    failed = [i.name for i in sup.instances if i.state == State.FAILED]
    return 1 if failed else 0


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a file (nothing when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def run_detached(argv: list[str], runtime: Path, timeout: float) -> int:
    """Start the supervisor (``hwprofile <argv> --foreground``) in its own session, wait for every
    instance to be ready (or fail)."""
    private_dir(runtime)
    out = open(runtime / "supervisor.out", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", *argv, "--foreground"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()
    end = time.monotonic() + timeout
    last = ""
    while time.monotonic() < end:
        state = read_state(runtime / STATE_FILE)
        if state and state.get("supervisor_pid") == proc.pid:
            states = [i["state"] for i in state["instances"]]
            line = ", ".join(f"{i['name']} {i['state']}" for i in state["instances"])
            if line != last:
                print(f"hwprofile: {line}", file=sys.stderr)
                last = line
            if states and all(s == "ready" for s in states):
                print(format_status(status(runtime)), end="")
                return 0
            if "failed" in states:
                print(format_status(status(runtime)), end="")
                return 1
        if proc.poll() is not None:
            ended = read_state(runtime / LAST_FILE)
            if ended and ended.get("supervisor_pid") == proc.pid:  # it ended on its own: how
                print(format_status(status(runtime)), end="")
                return 1
            print(
                f"hwprofile: the supervisor exited ({proc.returncode}); see {runtime / 'supervisor.out'}",
                file=sys.stderr,
            )
            tail = _tail(runtime / "supervisor.out")
            if tail:
                print(tail, file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(
        f"hwprofile: not ready after {timeout:.0f} s; still starting in the background (hwprofile status)",
        file=sys.stderr,
    )
    return 1


def demo_completion(
    url: str, model: str, prompt: str = "hwprofile plans vLLM launches", max_tokens: int = 16
) -> dict[str, Any]:
    """One greedy completion; with ``return_token_ids`` (vLLM 0.32 has it) the reply carries the
    prompt's and the generated token ids (``choices[0].prompt_token_ids``, ``.token_ids``); a reply
    without them is shown without ids. The prompt is added to the reply as ``prompt``."""
    from ..telemetry.http import post_json

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    reply = post_json(url + "/v1/completions", body, timeout=120)
    reply["prompt"] = prompt
    return reply
