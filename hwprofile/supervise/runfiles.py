"""Every file hwprofile keeps in its runtime directory (and the one it keeps in its state
directory): the names, the typed documents, the one writer and the one trusted reader.

- ``state.json`` (:class:`SupervisorDoc`): written by the supervisor at every change; read by
  ``status``, ``stop``, ``reload`` and a waiting ``launch``.
- ``last.json`` (:class:`SupervisorDoc`, with ``ended_at`` and why): written when a supervisor ends
  cleanly; read by ``status`` and by the next start.
- ``launch.json`` (:class:`LaunchDoc`): a detached ``launch`` hands its supervisor the plan.
- ``daemon.json`` (:class:`DaemonDoc`): the daemon's last tick; read by ``status`` and ``reload``.
- ``supervisor.lock``: empty, an ``flock`` held for the supervisor's life (:class:`RuntimeLock`).
- ``hwprofile.log``, ``supervisor.out``: logs, not documents.
- ``last-good-plan.json`` (:class:`LaunchDoc`, in the state directory): the plan the daemon last ran
  well; a daemon whose configuration is invalid starts from it, saying why.

Writing: :func:`write_doc`, the atomic write of :mod:`hwprofile.runtime.files` (never through a
link, mode 0600 before any byte). Reading: :func:`read_doc`, which trusts nothing it did not check:
the runtime directory is this user's own (:func:`hwprofile.runtime.dirs.check_private`: not a link,
not another user's, not writable by others without the sticky bit); the file is opened without
following a link and without blocking (a FIFO cannot hang it), must be a regular file of this user's
and at most :data:`MAX_BYTES`; it must be strict JSON (no NaN, no duplicate keys) and hold the
document's schema, every field of the right type and in range (the tables below, in the vocabulary
of :mod:`hwprofile.contracts`; the same tables are the published JSON Schemas in ``schemas/``). A
file that fails is a :class:`RunFileError` (exit 2) naming the file and what is wrong; a missing file
is ``None``. Root reading a file planted by someone else in a directory it does not own signals
nothing: it stops at the first check.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..contracts import BadJson, Const, Int, Invalid, List, Num, Obj, Str, parse_json
from ..errors import InputError, OperationError
from ..runtime.files import atomic_write, read_bounded
from ..runtime.lock import FileLock, held
from ..runtime.processes import Identity

if TYPE_CHECKING:
    from ..pipeline import PlanInputs
    from ..plan.types import Plan

STATE_FILE = "state.json"
LAST_FILE = "last.json"
LAUNCH_FILE = "launch.json"
DAEMON_FILE = "daemon.json"
LOCK_FILE = "supervisor.lock"
LAST_GOOD_FILE = "last-good-plan.json"  # in the state directory: a LaunchDoc the daemon ran
LOG_FILE = "hwprofile.log"
SUPERVISOR_OUT = "supervisor.out"

STATE_SCHEMA = "hwprofile.state/1"
LAUNCH_SCHEMA = "hwprofile.launch/1"
DAEMON_SCHEMA = "hwprofile.daemon/1"

MAX_BYTES = 32 << 20  # a launch file carries a host snapshot (at most 4 MiB) and a plan
MAX_INSTANCES = 256
MAX_GRACE_S = 7 * 86400  # a drain longer than a week is not one
_PID = Int(1, 1 << 22, null=False)  # Linux's PID_MAX_LIMIT
_TIME = Num(0, 1e11, unit=" (seconds since 1970)")
_TEXT = Str(65536, lines=True)


class RunFileError(InputError):
    """A run-time file that cannot be trusted or read as its document (exit 2); the message names
    the file and says what is wrong."""


# -- the contracts -----------------------------------------------------------------------------------

IDENTITY = Obj({"pid": _PID, "start_time": Int(0, 1 << 62, null=False)}, required=("pid", "start_time"))
INSTANCE = Obj(
    {
        "name": Str(128, null=False, pattern="[A-Za-z0-9][A-Za-z0-9._-]*", like="an instance name"),
        "state": Str(
            16,
            null=False,
            pattern="starting|ready|restarting|stopping|stopped|failed",
            like="starting, ready, restarting, stopping, stopped or failed",
        ),
        "pid": Int(1, 1 << 22),
        "process": IDENTITY.nullable(),
        "url": Str(2048, null=False),
        "gpus": List(Int(0, 1023, null=False), 1024),
        "numa_node": Int(0, 1023),
        "started_at": _TIME,
        "ready_at": _TIME,
        "restarts": Int(0, 1 << 31, null=False),
        "replacements": Int(0, 1 << 31),
        "ladder": List(
            Obj(
                {k: Str(4096, null=False) for k in ("rung", "change", "because", "set")},
                required=("rung", "change", "because", "set"),
            ),
            64,
        ),
        "failure": Obj(
            {"kind": Str(256, null=False), "evidence": _TEXT, "fix": _TEXT}, required=("kind",)
        ).nullable(),
        "log_dir": Str(4096, null=False),
        "log_file": Str(4096, null=False),
        "stop_grace_s": Num(0, MAX_GRACE_S, null=False, unit=" s"),
        "log_dropped_lines": Int(0, 1 << 62),
        "log_error": _TEXT,
        "argv": List(Str(1 << 20, null=False, lines=True), 4096),
        "engine": Obj({}).nullable(),
        "speculative": Obj({}).nullable(),
        "warnings": List(_TEXT.required(), 1024),
        "health_failing_since": _TIME,
        "unresponsive": Int(0, 1 << 31),
        "node": Str(64),
        "group_wait": _TEXT,
        "rejoins": Int(0, 1 << 31),
        "gpu_wait": _TEXT,
        "retry_at": _TIME,
        "gave_up": Int(0, 1 << 31),
    },
    required=("name", "state", "pid", "process", "url", "restarts", "stop_grace_s", "log_dir", "log_file"),
)
SUPERVISOR = Obj(
    {
        "schema": Const(STATE_SCHEMA),
        "supervisor_pid": _PID,
        "supervisor": IDENTITY.nullable(),
        "started_at": _TIME,
        "ended_at": _TIME,
        "end_reason": _TEXT,
        "previous": _TEXT,
        "endpoint": Obj(
            {"url": Str(2048, null=False), "via": Str(16, null=False)}, required=("url", "via")
        ).nullable(),
        "front": Obj(
            {
                "state": Str(16, null=False),
                "url": Str(2048, null=False),
                "pid": Int(1, 1 << 22),
                "restarts": Int(0, 1 << 31),
            },
            required=("state", "url"),
        ).nullable(),
        "profile": Str(256),
        "model": Str(4096),
        "vllm_version": Str(64),
        "instances": List(INSTANCE, MAX_INSTANCES),
    },
    required=("schema", "supervisor_pid", "supervisor", "instances"),
    doc="state.json while a supervisor runs, last.json once it ended",
)
LAUNCH = Obj(
    {
        "schema": Const(LAUNCH_SCHEMA),
        "vllm_version": Str(64, null=False),
        "plan": Obj({}, doc="a hwprofile.plan/1 document (schemas/hwprofile.plan-1.schema.json)"),
        "inputs": Obj(
            {
                "host": Obj({}, doc="a hwprofile.host/1 snapshot (schemas/hwprofile.host-1.schema.json)"),
                "config_root": Str(4096, null=False),
                "profile": Str(256),
                "overrides": List(Str(4096, null=False), 256),
                "sets": List(Str(65536, null=False), 4096),
                "model": Str(4096),
                "draft": Str(4096),
                "nodes": List(Obj({}, doc="a hwprofile.host/1 snapshot"), 64),
                "addresses": List(Str(256, null=False), 64),
                "node_rank": Int(0, 63),
            },
            required=("host", "config_root"),
        ),
    },
    required=("schema", "vllm_version", "plan", "inputs"),
    doc="what a detached launch hands its supervisor: the validated plan, its inputs, the vLLM release",
)
DAEMON = Obj(
    {
        "schema": Const(DAEMON_SCHEMA),
        "updated_at": Num(0, 1e11, null=False),
        "pid": _PID,
        "ticks": Int(0, 1 << 62, null=False),
        "missed_ticks": Int(0, 1 << 62, null=False),
        "tick_seconds": Num(0, 1e6),
        "watch": Obj({"interval": Num(0.01, 86400, null=False, unit=" s")}, required=("interval",)),
        "gpus": List(Obj({"index": Int(0, 1023, null=False)}, required=("index",)), 1024),
        "instances": List(Obj({"name": Str(128, null=False)}, required=("name",)), MAX_INSTANCES),
        "actions": List(Obj({}), 1000),
        "queued": List(Obj({}), 1000),
        "restarting": Str(128),
        "degrade_levels": Obj({}),
        "reload": Obj({}).nullable(),
        "reload_error": _TEXT,
        "pending_restarts": List(Str(128, null=False), MAX_INSTANCES),
        "troubles": List(_TEXT.required(), MAX_INSTANCES),
        "errors": List(_TEXT.required(), 10000),
    },
    required=("schema", "updated_at", "pid", "ticks", "missed_ticks", "watch"),
    doc="the daemon's last tick, for `hwprofile status` and `hwprofile reload`",
)


# -- the typed documents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceRecord:
    """One instance as its supervisor last recorded it (``state.json``'s ``instances[]``)."""

    name: str
    state: str
    pid: int | None
    process: Identity | None  # the process running now; None once it is reaped
    url: str
    stop_grace_s: float  # what stop waits before SIGKILL (shutdown_timeout + the stop margin)
    log_dir: str
    log_file: str
    restarts: int = 0
    replacements: int = 0
    gpus: tuple[int, ...] = ()
    numa_node: int | None = None
    started_at: float | None = None
    ready_at: float | None = None
    ladder: tuple[Mapping[str, str], ...] = ()
    failure: Mapping[str, str] | None = None
    log_dropped_lines: int = 0
    log_error: str | None = None
    argv: tuple[str, ...] = ()
    engine: Mapping[str, Any] | None = None
    speculative: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    health_failing_since: float | None = None  # /health has failed since (wall time); None: it answers
    unresponsive: int = 0  # restarts because /health kept failing while the process lived
    node: str | None = None  # a node of a multi-node group: "K of N" (None: a one-host instance)
    group_wait: str | None = None  # a headless node not ready yet: what it waits for (supervise.group)
    rejoins: int = 0  # new processes a headless node started to join node 0's next group
    gpu_wait: str | None = None  # the start gate (supervise.gate): what memory the next start waits for
    retry_at: float | None = None  # failed: when it is tried again (wall time); None: never, or not failed
    gave_up: int = 0  # give-ups in a row (too many failures in supervise.restart_window_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "pgid": self.pid,
            "process": self.process.to_json() if self.process else None,
            "url": self.url,
            "gpus": list(self.gpus),
            "numa_node": self.numa_node,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "restarts": self.restarts,
            "ladder": [dict(s) for s in self.ladder],
            "failure": dict(self.failure) if self.failure else None,
            "log_dir": self.log_dir,
            "log_file": self.log_file,
            "stop_grace_s": self.stop_grace_s,
            "log_dropped_lines": self.log_dropped_lines,
            "log_error": self.log_error,
            "argv": list(self.argv),
            "replacements": self.replacements,
            "engine": self.engine,
            "speculative": self.speculative,
            "warnings": list(self.warnings),
            "health_failing_since": self.health_failing_since,
            "unresponsive": self.unresponsive,
            "node": self.node,
            "group_wait": self.group_wait,
            "rejoins": self.rejoins,
            "gpu_wait": self.gpu_wait,
            "retry_at": self.retry_at,
            "gave_up": self.gave_up,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> InstanceRecord:
        p = d.get("process")
        return cls(
            name=d["name"],
            state=d["state"],
            pid=d.get("pid"),
            process=Identity(p["pid"], p["start_time"]) if p else None,
            url=d["url"],
            stop_grace_s=float(d["stop_grace_s"]),
            log_dir=d["log_dir"],
            log_file=d["log_file"],
            restarts=d.get("restarts") or 0,
            replacements=d.get("replacements") or 0,
            gpus=tuple(d.get("gpus") or ()),
            numa_node=d.get("numa_node"),
            started_at=d.get("started_at"),
            ready_at=d.get("ready_at"),
            ladder=tuple(d.get("ladder") or ()),
            failure=d.get("failure"),
            log_dropped_lines=d.get("log_dropped_lines") or 0,
            log_error=d.get("log_error"),
            argv=tuple(d.get("argv") or ()),
            engine=d.get("engine"),
            speculative=d.get("speculative"),
            warnings=tuple(d.get("warnings") or ()),
            health_failing_since=d.get("health_failing_since"),
            unresponsive=d.get("unresponsive") or 0,
            node=d.get("node"),
            group_wait=d.get("group_wait"),
            rejoins=d.get("rejoins") or 0,
            gpu_wait=d.get("gpu_wait"),
            retry_at=d.get("retry_at"),
            gave_up=d.get("gave_up") or 0,
        )


@dataclass(frozen=True)
class SupervisorDoc:
    """``state.json`` (a supervisor runs, or ran and died without cleaning up) or ``last.json`` (it
    ended cleanly: ``ended_at`` is set and no process is left to signal)."""

    supervisor: Identity
    instances: tuple[InstanceRecord, ...] = ()
    started_at: float | None = None
    profile: str | None = None
    model: str | None = None
    vllm_version: str | None = None
    ended_at: float | None = None
    end_reason: str | None = None  # last.json: why the supervisor ended
    previous: str | None = None  # how the run before this one in the same runtime directory ended
    endpoint: Mapping[str, Any] | None = None  # the plan's one URL for clients (plan.endpoint's JSON)
    front: Mapping[str, Any] | None = (
        None  # vLLM's router in front of the servers (supervise.router's record)
    )

    @property
    def supervisor_pid(self) -> int:
        return self.supervisor.pid

    def ended(self, at: float, reason: str) -> SupervisorDoc:
        """This document as ``last.json``: ended at ``at`` for ``reason``, no process left to signal."""
        front = {**self.front, "pid": None, "process": None} if self.front is not None else None
        return replace(
            self,
            ended_at=at,
            end_reason=reason,
            instances=tuple(replace(i, process=None) for i in self.instances),
            front=front,
        )

    def how_it_ended(self) -> str:
        """One line for the next run: when and why this one ended (or that it did not say)."""
        import time as _time

        names = ", ".join(f"{i.name} {i.state}" for i in self.instances) or "no instance"
        if self.ended_at is None:
            return (
                f"supervisor pid {self.supervisor_pid} ended without cleaning up (killed or crashed; "
                f"its last record: {names})"
            )
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(self.ended_at))
        return f"supervisor pid {self.supervisor_pid} ended at {when}: {self.end_reason or 'no reason recorded'} ({names})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": STATE_SCHEMA,
            "supervisor_pid": self.supervisor.pid,
            "supervisor": self.supervisor.to_json(),
            "started_at": self.started_at,
            "profile": self.profile,
            "model": self.model,
            "vllm_version": self.vllm_version,
            "instances": [i.to_json() for i in self.instances],
        }
        if self.ended_at is not None:
            out["ended_at"] = self.ended_at
            out["end_reason"] = self.end_reason
        if self.previous is not None:
            out["previous"] = self.previous
        if self.endpoint is not None:
            out["endpoint"] = dict(self.endpoint)
        if self.front is not None:
            out["front"] = dict(self.front)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SupervisorDoc:
        s = d.get("supervisor") or {"pid": d["supervisor_pid"], "start_time": 0}
        if s["pid"] != d["supervisor_pid"]:
            raise Invalid("supervisor.pid", f"{s['pid']} is not supervisor_pid {d['supervisor_pid']}")
        return cls(
            Identity(s["pid"], s["start_time"]),
            tuple(InstanceRecord.from_json(i) for i in d["instances"]),
            d.get("started_at"),
            d.get("profile"),
            d.get("model"),
            d.get("vllm_version"),
            d.get("ended_at"),
            d.get("end_reason"),
            d.get("previous"),
            d.get("endpoint"),
            d.get("front"),
        )


@dataclass(frozen=True)
class LaunchDoc:
    """``launch.json``: what a detached ``launch`` hands its supervisor (no detection, no second
    planning there)."""

    plan: Plan
    inputs: PlanInputs
    vllm_version: str

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": LAUNCH_SCHEMA,
            "vllm_version": self.vllm_version,
            "plan": self.plan.to_json(),
            "inputs": self.inputs.to_json(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], source: str = LAUNCH_FILE) -> LaunchDoc:
        from ..pipeline import PlanInputs
        from ..plan.types import Plan

        try:
            return cls(
                Plan.from_json(d["plan"]), PlanInputs.from_json(d["inputs"], source), d["vllm_version"]
            )
        except (KeyError, TypeError, ValueError) as e:
            raise Invalid("plan", f"not a plan and its inputs: {e}") from None


@dataclass(frozen=True)
class DaemonDoc:
    """``daemon.json``: the daemon's last published tick. ``gpus`` and ``instances`` are the
    watcher's report (their fields: the daemon docs); ``current`` says whether it is fresh."""

    updated_at: float
    pid: int
    ticks: int
    missed_ticks: int
    interval: float
    body: Mapping[str, Any] = field(default_factory=dict)  # the whole document, as written

    def current(self, now: float) -> bool:
        """Younger than ten ticks (plus five seconds): the daemon is still ticking."""
        return now - self.updated_at <= 10 * self.interval + 5

    def to_json(self) -> dict[str, Any]:
        return dict(self.body)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DaemonDoc:
        return cls(d["updated_at"], d["pid"], d["ticks"], d["missed_ticks"], d["watch"]["interval"], d)


Doc = TypeVar("Doc", SupervisorDoc, LaunchDoc, DaemonDoc)
_CONTRACTS: dict[type, tuple[Obj, str]] = {
    SupervisorDoc: (SUPERVISOR, STATE_SCHEMA),
    LaunchDoc: (LAUNCH, LAUNCH_SCHEMA),
    DaemonDoc: (DAEMON, DAEMON_SCHEMA),
}


# -- reading and writing -------------------------------------------------------------------------


def read_doc(path: Path, kind: type[Doc], check_dir: bool = True) -> Doc | None:
    """The document of ``kind`` in ``path`` (see the module doc for every check), or None when the
    file does not exist. ``check_dir``: the directory holding it must be this user's own, as the
    runtime directory is (a ``--plan-file`` elsewhere is checked as a file only)."""
    from ..runtime.dirs import UnsafeDirectory, check_private

    if check_dir:
        try:
            check_private(path.parent)
        except FileNotFoundError:
            return None
        except UnsafeDirectory as e:
            raise RunFileError(f"{path}: not read: {e}") from None
    try:
        raw = read_bounded(path, MAX_BYTES, follow=False, owner=os.geteuid())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunFileError(f"{path}: not read: {e.strerror or e}") from None
    table, schema = _CONTRACTS[kind]
    try:
        data = parse_json(raw)
        if not isinstance(data, dict) or data.get("schema") != schema:
            got = data.get("schema") if isinstance(data, dict) else None
            raise Invalid("schema", f"expected {schema!r}, got {got!r}")
        table.check(data, "")
        if issubclass(kind, LaunchDoc):
            return kind.from_json(data, str(path))
        return kind.from_json(data)
    except BadJson as e:
        raise RunFileError(f"{path}{e.where}: {e.message}") from None
    except Invalid as e:
        raise RunFileError(f"{path}: not a {schema} document: {e}") from None


def write_doc(path: Path, doc: SupervisorDoc | LaunchDoc | DaemonDoc, durable: bool = True) -> None:
    """Write ``doc`` to ``path`` atomically, 0600 (``durable=False``: no fsync, for a file rewritten
    every second on a tmpfs: also compact, so that json's C encoder writes it; an indent takes the pure
    Python one, a third of the daemon's tick)."""
    text = json.dumps(doc.to_json(), indent=1 if durable else None, default=str)
    atomic_write(path, text, 0o600, durable=durable)


@dataclass(frozen=True)
class DirIdentity:
    """What makes a runtime directory the one a process made or checked: its device and inode, owner
    and mode, read without following a link (``lstat``)."""

    dev: int
    ino: int
    uid: int
    mode: int

    @classmethod
    def of(cls, path: Path) -> DirIdentity | None:
        """The identity of the directory at ``path``; None when nothing (or not a directory) is there.
        Raises ``OSError`` when it cannot be looked at."""
        import stat

        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        return cls(st.st_dev, st.st_ino, st.st_uid, stat.S_IMODE(st.st_mode))

    def trouble(self, path: Path) -> str | None:
        """Why ``path`` is no longer this directory (gone, replaced, another owner or mode), or None."""
        try:
            now = DirIdentity.of(path)
        except OSError as e:
            return f"the runtime directory {path} cannot be checked: {e.strerror or e}"
        if now is None:
            return f"the runtime directory {path} is gone"
        if (now.dev, now.ino) != (self.dev, self.ino):
            return f"the runtime directory {path} was replaced by a directory this process did not make"
        if now.uid != self.uid:
            return f"the runtime directory {path} now belongs to uid {now.uid}, not {self.uid}"
        if now.mode != self.mode:
            return f"the runtime directory {path} changed mode ({oct(self.mode)} -> {oct(now.mode)})"
        return None


def remove(path: Path) -> None:
    """Remove a run-time file; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def json_schema(kind: type) -> dict[str, Any]:
    """The contract of ``kind`` as JSON Schema (draft 2020-12): what ``schemas/`` holds (a test
    keeps the files equal to this). Regenerate them with ``python -m hwprofile.supervise.runfiles``."""
    table, schema = _CONTRACTS[kind]
    name = schema.replace("/", "-")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://github.com/hwprofile/hwprofile/schemas/{name}.schema.json",
        "title": f"hwprofile run-time file ({schema})",
        **table.schema(),
        "description": (
            f"{table.doc}. Read by hwprofile only from a directory and a file of the reading user's own, "
            f"not through a link, at most {MAX_BYTES} bytes, strict JSON (no NaN, Infinity or duplicate "
            "keys). Keys not listed here are ignored."
        ),
    }


# -- the supervisor's lock ---------------------------------------------------------------------------


class AlreadySupervising(OperationError):
    """Another supervisor holds the runtime directory's lock."""


class RuntimeLock(FileLock):
    """The supervisor's lock, ``<runtime>/supervisor.lock``, held for its whole life."""

    def __init__(self, runtime: Path) -> None:
        super().__init__(runtime / LOCK_FILE, lambda: AlreadySupervising(already_message(runtime)))


def lock_held(runtime: Path) -> bool:
    """Whether some process holds the supervisor lock of ``runtime`` now."""
    return held(runtime / LOCK_FILE)


def already_message(runtime: Path) -> str:
    """Why a second supervisor cannot start here, naming the first where its state says who it is."""
    try:
        state = read_doc(runtime / STATE_FILE, SupervisorDoc)
        who = f" (pid {state.supervisor_pid})" if state else ""
    except RunFileError as e:
        who = f" (its state file cannot be read: {e})"
    return f"hwprofile is already supervising in {runtime}{who}: `hwprofile stop` first, or use another --runtime-dir"


if (
    __name__ == "__main__"
):  # python -m hwprofile.supervise.runfiles: write schemas/hwprofile.{state,launch,daemon}-1.schema.json
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")
    for doc_kind, (_, doc_schema) in _CONTRACTS.items():
        target = out / f"{doc_schema.replace('/', '-')}.schema.json"
        target.write_text(json.dumps(json_schema(doc_kind), indent=2, ensure_ascii=False) + "\n")
        print(target)
