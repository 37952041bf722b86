"""Run-time inputs that used to end in a traceback or a wrong answer: a runtime directory deleted under the
daemon, or replaced by someone else's; a runtime or logs directory that is a file, under a file, in /proc;
a supervisor lock that is a symbolic-link loop; an HTML page on the metrics URL; a non-numeric position
label; a config root that is a FIFO; ``--set =1``. Each is a clear error or a degraded state, never a
traceback, and the running daemon keeps its last good state."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import runcli

from hwprofile.runtime.dirs import UnsafeDirectory, private_dir
from hwprofile.supervise.runfiles import DAEMON_FILE, LOCK_FILE, RuntimeLock, lock_held


def hw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args, extra_env=env, timeout=120)


def _daemon(runtime: Path):  # -> (Daemon, the fake supervisor)
    from test_overrides import _plan, _Sampler, _Sup

    from hwprofile.daemon.loop import Daemon

    plan = _plan({"a": 64})
    sup = _Sup(["a"])
    private_dir(runtime)
    sup.runtime_lock = RuntimeLock(runtime)
    sup.runtime_lock.acquire()
    sup.saved = 0

    def save() -> None:
        sup.saved += 1

    sup.save = save
    t = [0.0]
    d = Daemon(
        plan, lambda sets: plan, sup, _Sampler(), plan.watch, plan.degrade, runtime, clock=lambda: t[0]
    )
    return d, sup


def test_a_runtime_directory_deleted_under_the_daemon_is_made_again_with_its_lock(
    tmp_path: Path, caplog
) -> None:
    from hwprofile.daemon.notify import status_line

    runtime = tmp_path / "run" / "hwprofile"
    d, sup = _daemon(runtime)
    try:
        d.tick()
        assert (runtime / DAEMON_FILE).exists()
        shutil.rmtree(runtime)  # logout without linger: /run/user/UID goes
        assert not lock_held(runtime)
        with caplog.at_level("WARNING", logger="hwprofile"):
            d.tick()
        assert stat.S_IMODE(os.lstat(runtime).st_mode) == 0o700 and os.lstat(runtime).st_uid == os.geteuid()
        assert (runtime / DAEMON_FILE).exists() and sup.saved == 1  # status and reload find it again
        assert lock_held(runtime)  # a second daemon is refused
        from hwprofile.supervise.runfiles import AlreadySupervising

        with pytest.raises(AlreadySupervising):
            RuntimeLock(runtime).acquire(wait=0.0)
        assert any("was deleted under the daemon: made again" in r.getMessage() for r in caplog.records)
        # only the lock file deleted: taken again too
        (runtime / LOCK_FILE).unlink()
        d.tick()
        assert lock_held(runtime) and d.runtime_trouble is None
        # another directory in its place, made by someone else: never written into, reported
        shutil.rmtree(runtime)
        runtime.mkdir(mode=0o755)
        (runtime / "theirs").write_text("x")
        d.tick()
        d.tick()
        assert sorted(os.listdir(runtime)) == ["theirs"]
        assert d.runtime_trouble and "replaced by a directory this daemon did not make" in d.runtime_trouble
        assert "not written into" in status_line(d)
        assert sum("replaced by a directory" in e for e in d.errors) == 1  # said once, not at every tick
    finally:
        sup.runtime_lock.release()


def test_a_lock_taken_by_a_second_daemon_meanwhile_is_reported_not_stolen(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    d, sup = _daemon(runtime)
    other = RuntimeLock(runtime)
    try:
        (runtime / LOCK_FILE).unlink()  # gone, and a second daemon took a new one at once
        other.acquire(wait=0.0)
        d.tick()
        assert d.runtime_trouble and "cannot be taken again" in d.runtime_trouble
        assert sup.runtime_lock.fd is not None  # the old lock is kept
    finally:
        other.release()
        sup.runtime_lock.release()


def test_runtime_and_logs_directories_that_cannot_be_directories_are_clear_errors(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    for bad, want in (
        (f, "not a directory"),
        (f / "sub", "a part of the path above it is a file"),
        (Path("/proc/hwprofile-test/x"), "cannot be created"),
    ):
        with pytest.raises(UnsafeDirectory, match=want):
            private_dir(bad)
    for rd, want in ((f, "is not a directory"), (f / "sub", "is not a directory")):
        r = hw("status", env={"HWPROFILE_RUNTIME_DIR": str(rd)})
        assert r.returncode != 0 and "Traceback" not in r.stderr and want in r.stderr, r.stderr


def test_a_supervisor_lock_that_is_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    private_dir(rt)
    os.symlink("b", rt / "a")
    os.symlink("a", rt / "b")
    os.symlink("a", rt / LOCK_FILE)
    r = hw("status", env={"HWPROFILE_RUNTIME_DIR": str(rt)})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "a symbolic link" in r.stderr, r.stderr


def test_a_config_root_that_is_a_fifo_or_a_file_names_the_variable(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("")
    for name, kind in (("fifo", "a FIFO"), ("file", "a file")):
        r = hw("plan", "--json", env={"HWPROFILE_CONFIG_ROOT": str(tmp_path / name)})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"HWPROFILE_CONFIG_ROOT={tmp_path / name}: {kind}" in r.stderr, r.stderr


@pytest.mark.parametrize(("arg", "why"), [("=1", "no setting's name before '='"), ("1", "no '='")])
def test_set_without_a_key_names_the_syntax(arg: str, why: str) -> None:
    r = hw("plan", "--json", "--set", arg)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"--set {arg}: {why}: the syntax is --set KEY=VALUE" in r.stderr, r.stderr


def test_an_html_page_on_the_metrics_url_is_not_a_server_with_stats_off() -> None:
    from test_daemon_telemetry import _Server

    from hwprofile.telemetry.scrape import scrape

    srv = _Server()
    try:
        srv.body = "<!DOCTYPE html>\n<html><body>Login</body></html>\n"
        r = scrape("a", srv.url, 0.0)
    finally:
        srv.close()
    assert (
        r.status == "error"
        and "an HTML or XML page" in (r.error or "")
        and "disable-log-stats" not in (r.error or "")
    )


def test_a_non_numeric_position_label_is_an_error_for_advice_and_the_daemon() -> None:
    from test_daemon_telemetry import _Server

    from hwprofile.cli.advice import AdviceError, advice_from
    from hwprofile.telemetry.metrics import MetricsError, parse

    text = (
        'vllm:num_requests_running{engine="0"} 1\n'
        'vllm:spec_decode_num_drafts_total{engine="0"} 500\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="first"} 9\n'
    )
    with pytest.raises(MetricsError, match="position 'first' is not a number"):
        parse(text)
    srv = _Server()
    srv.body = text
    try:
        with pytest.raises(AdviceError, match="is not a number"):
            advice_from(srv.url, None, None)  # type: ignore[arg-type]
    finally:
        srv.close()


def test_errors_carry_their_time_and_a_fixed_one_is_taken_off(tmp_path: Path) -> None:
    import re

    runtime = tmp_path / "rt"
    d, sup = _daemon(runtime)
    try:
        d.tick()
        # daemon.json cannot be written: a directory in its place
        (runtime / DAEMON_FILE).unlink()
        (runtime / DAEMON_FILE).mkdir()
        d.tick()
        d.tick()
        (err,) = [e for e in d.errors if "cannot write" in e]
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ cannot write ", err), err
        (runtime / DAEMON_FILE).rmdir()
        d.tick()
        assert not [e for e in d.errors if "cannot write" in e]  # fixed: no longer listed
        doc = __import__("json").loads((runtime / DAEMON_FILE).read_text())
        assert not [e for e in doc["errors"] if "cannot write" in e]
    finally:
        sup.runtime_lock.release()


def test_status_tells_a_daemon_that_ticks_but_cannot_write_from_one_that_stopped(tmp_path: Path) -> None:
    import json

    from hwprofile.launch.status import _daemon_view

    runtime = tmp_path / "rt"
    d, sup = _daemon(runtime)
    try:
        d.tick()
    finally:
        sup.runtime_lock.release()
    path = runtime / DAEMON_FILE
    doc = json.loads(path.read_text())
    doc["updated_at"] -= 3600  # its figures are an hour old
    path.write_text(json.dumps(doc))
    os.utime(path, (doc["updated_at"], doc["updated_at"]))
    import time

    view = _daemon_view(runtime, time.time())
    assert view is not None and not view["current"] and not view["ticking"]  # not ticking
    os.utime(path)  # what the daemon does when the write fails: a new time, the old figures
    view = _daemon_view(runtime, time.time())
    assert view is not None and not view["current"] and view["ticking"]


def test_the_own_log_rotates_and_is_opened_again_when_deleted(tmp_path: Path) -> None:
    import logging

    from hwprofile.runtime import files

    path = tmp_path / "hwprofile.log"
    h = files.own_log_handler(path)
    lg = logging.getLogger("hwprofile-test-own-log")
    lg.addHandler(h)
    lg.propagate = False
    try:
        line = "x" * 1000
        for _ in range(files.OWN_LOG_BYTES // 1000 * 3):
            lg.warning(line)
        assert path.stat().st_size <= files.OWN_LOG_BYTES and (tmp_path / "hwprofile.log.1").exists()
        assert not (tmp_path / "hwprofile.log.2").exists()
        path.unlink()
        (tmp_path / "hwprofile.log.1").unlink()
        lg.warning("after the delete")
        assert path.read_text().strip() == "after the delete" and stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        lg.removeHandler(h)
        h.close()
