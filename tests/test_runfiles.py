"""The run-time files (hwprofile/supervise/runfiles.py): one writer, one trusted reader, typed documents and
their published schemas. A file hwprofile did not write — planted by another user, a link, a FIFO,
a device, oversized, malformed — is refused with the file's name, never trusted, never signalled.

Tests run as root here (CI too): files and directories of "another user" are made with chown."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import runcli

from hwprofile.runtime.processes import Identity, identify
from hwprofile.supervise import runfiles
from hwprofile.supervise.runfiles import (
    DAEMON_FILE,
    STATE_FILE,
    STATE_SCHEMA,
    DaemonDoc,
    InstanceRecord,
    LaunchDoc,
    RunFileError,
    SupervisorDoc,
    read_doc,
    write_doc,
)

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")


@pytest.fixture
def rt(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def victim() -> Iterator[Identity]:
    """A process a planted state file could name: it must never be signalled."""
    p = subprocess.Popen(["sleep", "60"])
    ident = identify(p.pid)
    assert ident is not None
    yield ident
    p.kill()
    p.wait()


def record(**over: Any) -> dict[str, Any]:
    rec = InstanceRecord(
        "vllm-cpu", "ready", 12, Identity(12, 34), "http://127.0.0.1:8000", 12.0, "/l", "/l/v.log"
    )
    return {**rec.to_json(), **over}


def state(victim: Identity | None = None, **instance: Any) -> dict[str, Any]:
    me = identify(os.getpid())
    assert me is not None
    inst = record(**({"pid": victim.pid, "process": victim.to_json()} if victim else {}), **instance)
    return {"schema": STATE_SCHEMA, "supervisor_pid": me.pid, "supervisor": me.to_json(), "instances": [inst]}


def put(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(0o600)
    return path


def hw(*args: str) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args)


# -- the contracts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [SupervisorDoc, LaunchDoc, DaemonDoc], ids=lambda k: k.__name__)
def test_published_schemas_are_the_contracts(kind: type) -> None:
    name = runfiles._CONTRACTS[kind][1].replace("/", "-")
    published = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    assert published == runfiles.json_schema(kind), "regenerate: python -m hwprofile.supervise.runfiles"


def test_documents_round_trip_and_validate_against_their_schema(rt: Path, victim: Identity) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = SupervisorDoc.from_json(
        state(victim, ladder=[{"rung": "r", "change": "c", "because": "b", "set": "s"}])
    )
    write_doc(rt / STATE_FILE, doc)
    assert stat.S_IMODE(os.stat(rt / STATE_FILE).st_mode) == 0o600
    back = read_doc(rt / STATE_FILE, SupervisorDoc)
    assert back == doc and back.instances[0].process == victim
    jsonschema.validate(json.loads((rt / STATE_FILE).read_text()), runfiles.json_schema(SupervisorDoc))
    last = doc.ended(123.0, "stopped by SIGTERM")
    assert last.ended_at == 123.0 and all(i.process is None for i in last.instances)
    assert "ended at" in last.how_it_ended() and "stopped by SIGTERM" in last.how_it_ended()
    assert "ended without cleaning up" in doc.how_it_ended()
    d = {
        "schema": runfiles.DAEMON_SCHEMA,
        "updated_at": time.time(),
        "pid": 1,
        "ticks": 3,
        "missed_ticks": 0,
        "watch": {"interval": 1.0},
        "gpus": [{"index": 0, "thermal_state": "ok"}],
        "instances": [],
    }
    write_doc(rt / DAEMON_FILE, DaemonDoc.from_json(d))
    got = read_doc(rt / DAEMON_FILE, DaemonDoc)
    assert got is not None and got.current(time.time()) and not got.current(time.time() + 16)
    jsonschema.validate(d, runfiles.json_schema(DaemonDoc))


# -- what the trusted reader refuses -------------------------------------------------------------------

MALFORMED = {
    "instances-a-string": {**state(), "instances": "abc"},
    "an-empty-instance": {**state(), "instances": [{}]},
    "grace-negative": state(stop_grace_s=-5),
    "grace-huge": state(stop_grace_s=1e23),
    "pid-zero": state(pid=0),
    "pid-a-string": state(pid="123"),
    "state-unknown": state(state="dancing"),
    "no-supervisor": {k: v for k, v in state().items() if k != "supervisor"},
    "supervisor-pids-differ": {**state(), "supervisor_pid": 1},
    "wrong-schema": {**state(), "schema": "hwprofile.state/9"},
    "a-list": [state()],
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_documents_are_refused_naming_the_file(rt: Path, name: str) -> None:
    path = put(rt / STATE_FILE, MALFORMED[name])
    with pytest.raises(RunFileError, match=f"^{path}: not a hwprofile.state/1 document"):
        read_doc(path, SupervisorDoc)


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"stop_grace_s": NaN}', "NaN and Infinity"),
        ('{"a": 1, "a": 2}', "appears twice"),
        ("{broken", "invalid JSON"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_text_that_is_not_strict_json_is_refused(rt: Path, text: str | bytes, why: str) -> None:
    path = rt / STATE_FILE
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)  # type: ignore[operator]
    with pytest.raises(RunFileError, match=why):
        read_doc(path, SupervisorDoc)


def test_a_link_a_fifo_a_device_and_an_oversized_file_are_refused_without_hanging(
    rt: Path, tmp_path: Path
) -> None:
    target = put(tmp_path / "elsewhere.json", state())
    (rt / STATE_FILE).symlink_to(target)
    with pytest.raises(RunFileError, match="a symbolic link"):
        read_doc(rt / STATE_FILE, SupervisorDoc)
    (rt / STATE_FILE).unlink()
    os.mkfifo(rt / STATE_FILE, 0o600)  # no writer: a blocking open would wait forever
    with pytest.raises(RunFileError, match="a FIFO"):
        read_doc(rt / STATE_FILE, SupervisorDoc)
    (rt / STATE_FILE).unlink()
    if os.geteuid() == 0:
        os.mknod(rt / STATE_FILE, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: endless
        with pytest.raises(RunFileError, match="a character device"):
            read_doc(rt / STATE_FILE, SupervisorDoc)
        (rt / STATE_FILE).unlink()
    with open(rt / STATE_FILE, "wb") as f:
        f.truncate(runfiles.MAX_BYTES + 1)
    with pytest.raises(RunFileError, match="more than the"):
        read_doc(rt / STATE_FILE, SupervisorDoc)


@needs_root
def test_another_users_file_or_directory_is_not_trusted(rt: Path, tmp_path: Path) -> None:
    path = put(rt / STATE_FILE, state())
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(RunFileError, match="owned by uid 65534"):
        read_doc(path, SupervisorDoc)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    put(theirs / STATE_FILE, state())
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(RunFileError, match="owned by uid 65534"):
        read_doc(theirs / STATE_FILE, SupervisorDoc)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone may replace state.json in it: no sticky bit
    put(open_dir / STATE_FILE, state())
    with pytest.raises(RunFileError, match="writable by group and others"):
        read_doc(open_dir / STATE_FILE, SupervisorDoc)


# -- the commands that act on what they read ------------------------------------------------------------


@needs_root
def test_stop_and_reload_never_signal_what_a_planted_file_names(rt: Path, victim: Identity) -> None:
    """root's `hwprofile stop` read state.json with a bare read_text() and SIGTERMed the process it
    named (its start time matched: /proc is readable); `reload` SIGHUPed one. Now the file is refused
    first: exit 2, the file named, the process untouched."""
    path = put(rt / STATE_FILE, state(victim))
    os.chown(path, NOBODY, NOBODY)
    for command in ("stop", "reload", "status"):
        r = hw(command, "--runtime-dir", str(rt))
        assert r.returncode == 2 and f"{path}:" in r.stderr and "owned by uid 65534" in r.stderr, (command, r)
        assert "Traceback" not in r.stderr
    path.unlink()
    elsewhere = put(rt.parent / "other.json", state(victim))
    (rt / STATE_FILE).symlink_to(elsewhere)
    r = hw("stop", "--runtime-dir", str(rt))
    assert r.returncode == 2 and "a symbolic link" in r.stderr
    os.kill(victim.pid, 0)  # still there: never signalled
    assert identify(victim.pid) == victim


def test_a_nan_grace_cannot_make_stop_wait_forever(rt: Path, victim: Identity) -> None:
    put(rt / STATE_FILE, json.dumps(state(victim)).replace('"stop_grace_s": 12.0', '"stop_grace_s": NaN'))
    r = hw("stop", "--runtime-dir", str(rt))
    assert r.returncode == 2 and "NaN" in r.stderr
    assert identify(victim.pid) == victim


def test_status_says_when_the_lock_is_held_but_the_state_is_unreadable(rt: Path) -> None:
    from hwprofile.supervise.runfiles import RuntimeLock

    lock = RuntimeLock(rt)
    lock.acquire()
    try:
        put(rt / STATE_FILE, {**state(), "instances": "abc"})
        r = hw("status", "--runtime-dir", str(rt))
        assert r.returncode == 2 and "a supervisor holds the lock" in r.stderr
        (rt / STATE_FILE).unlink()
        st = json.loads(hw("status", "--json", "--runtime-dir", str(rt)).stdout)
        assert not st["running"] and "has written no state yet" in st["note"]
    finally:
        lock.release()
