"""A launch that returns once its plan is ready: a supervisor of its own (``hwprofile launch
--plan-file <runtime>/launch.json``, in its own session) supervises the plan this process validated;
this waits until every instance is ready, or one failed, or the supervisor ended."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..errors import HwprofileError
from ..runtime.dirs import private_dir
from ..runtime.processes import module_command
from ..supervise.runfiles import (
    LAST_FILE,
    LAUNCH_FILE,
    STATE_FILE,
    SUPERVISOR_OUT,
    LaunchDoc,
    RunFileError,
    SupervisorDoc,
    read_doc,
    write_doc,
)
from .start import Launch, Refused
from .status import format_status, status


def write_launch_file(launch: Launch) -> Path:
    """The validated plan, its inputs (for re-plans) and the vLLM release, for the detached
    supervisor: ``<runtime>/launch.json``."""
    assert launch.inputs is not None  # a detached supervisor re-plans from the same inputs
    path = private_dir(launch.runtime) / LAUNCH_FILE
    write_doc(path, LaunchDoc(launch.plan, launch.inputs, launch.release.rendered_for))
    return path


def read_launch_file(path: Path) -> LaunchDoc:
    """:func:`write_launch_file`'s document; a regular file of this user's, not through a link, whose
    plan is the one its inputs give (planned again from the snapshot it carries: pure, no second
    detection): a plan edited in the file (``max_num_seqs: -5``) is never handed to vLLM."""
    try:
        doc = read_doc(path, LaunchDoc, check_dir=False)
    except RunFileError as e:
        raise RunFileError(f"--plan-file {e}") from None
    if doc is None:
        raise RunFileError(f"--plan-file {path}: no such file")
    try:
        again = doc.inputs.replan()
    except HwprofileError as e:
        raise RunFileError(f"--plan-file {path}: its inputs do not plan: {'; '.join(e.messages())}") from None
    if again.to_json() != doc.plan.to_json():
        changed = _first_difference(doc.plan.to_json(), again.to_json())
        raise RunFileError(f"--plan-file {path}: the plan is not what its inputs plan ({changed}): not used")
    return doc


def _first_difference(a: object, b: object, where: str = "plan") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{where}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return (
        f"{where}: {json.dumps(a, default=str)[:80]} in the file, {json.dumps(b, default=str)[:80]} planned"
    )


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a file (nothing when it cannot be read)."""
    from ..runtime.files import read_bounded

    try:
        text = read_bounded(path, 1 << 20, follow=False).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def run_detached(launch: Launch, timeout: float) -> int:
    """Write the launch file, start ``hwprofile launch --plan-file`` in its own session, and wait for
    every instance (and vLLM's router in front, where planned) to be ready (exit 0) or one to fail (1)."""
    runtime = launch.runtime
    plan_file = write_launch_file(launch)
    out = open(runtime / SUPERVISOR_OUT, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [*module_command(), "launch", "--plan-file", str(plan_file), "--runtime-dir", str(runtime)],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    end = time.monotonic() + timeout
    last = ""
    while time.monotonic() < end:
        state = read_doc(runtime / STATE_FILE, SupervisorDoc)
        if state is not None and state.supervisor_pid == proc.pid:
            front = state.front.get("state") if state.front else None  # vLLM's router in front, if planned
            line = ", ".join(f"{i.name} {i.state}" for i in state.instances) + (
                f", vllm-router {front}" if front else ""
            )
            if line != last:
                print(f"hwprofile: {line}", file=sys.stderr)
                last = line
            states = [i.state for i in state.instances]
            if states and all(s == "ready" for s in states) and front in (None, "ready"):
                print(format_status(status(runtime)), end="")
                return 0
            if "failed" in states:
                print(format_status(status(runtime)), end="")
                return 1
        if proc.poll() is not None:
            ended = read_doc(runtime / LAST_FILE, SupervisorDoc)
            if ended is not None and ended.supervisor_pid == proc.pid:  # it ended on its own: how
                print(format_status(status(runtime)), end="")
                return 1
            tail = _tail(runtime / SUPERVISOR_OUT)
            raise Refused(
                f"the supervisor exited ({proc.returncode}); see {runtime / SUPERVISOR_OUT}"
                + (f":\n{tail}" if tail else "")
            )
        time.sleep(0.5)
    print(
        f"hwprofile: not ready after {timeout:.0f} s; still starting in the background (hwprofile status)",
        file=sys.stderr,
    )
    return 1
