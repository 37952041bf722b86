"""The CLI builds only the parser of the command it runs; it must equal the full parser's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env
from fakehost import build

from hwprofile.cli import _commands, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", [c[0] for c in _commands()])
def test_one_command_parser_equals_the_full_one(name: str) -> None:
    full, one = _subparsers(build_parser()), _subparsers(build_parser(name))
    assert list(one) == [name]
    assert one[name].format_help() == full[name].format_help()
    argv = [name, "--format", "argv"] if name == "render" else [name]
    assert vars(build_parser(name).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_every_command_is_documented_in_the_readme() -> None:
    """The README's command table and the parser name the same commands."""
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme[readme.index("## Commands") : readme.index("###", readme.index("## Commands"))]
    documented = set(re.findall(r"^\| `hwprofile ([a-z-]+)", table, re.M))
    assert documented == set(_subparsers(build_parser())), documented ^ set(_subparsers(build_parser()))


def _script() -> str:
    path = Path(sys.executable).parent / "hwprofile"
    assert path.exists(), "the console script is installed with the package (pip install -e .)"
    return str(path)


def test_quick_exit_writes_the_whole_answer(tmp_path: Path, fake_nvml_dir: Path) -> None:
    """`detect` leaves without interpreter teardown: its output must still be complete, to a file
    and to a pipe whose reader stops early."""
    host = build("h100-sxm-8x", tmp_path / "h")
    env = cli_env(host, fake_nvml_dir)
    out = tmp_path / "snap.json"
    with out.open("w") as f:
        r = subprocess.run(
            [_script(), "detect", "--json"], env=env, stdout=f, stderr=subprocess.PIPE, text=True
        )
    assert r.returncode == 0, r.stderr
    snap = json.loads(out.read_text())
    assert len(snap["gpus"]) == 8 and snap["schema"] == "hwprofile.host/1"
    assert r.stderr == ""
    head = subprocess.Popen(
        [_script(), "detect", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert head.stdout is not None
    first = head.stdout.read(100)
    head.stdout.close()  # the reader leaves
    _, err = head.communicate()
    assert first.startswith(b"{") and head.returncode == 0 and err == b""


def test_quick_exit_keeps_exit_codes_and_errors(tmp_path: Path) -> None:
    r = subprocess.run(
        [_script(), "plan", "--from", str(tmp_path / "none.json")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "cannot read snapshot" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([_script(), "detect", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
    if Path("/dev/full").exists():  # a disk that is full: the answer did not get out, say so
        with open("/dev/full", "w") as f:
            r = subprocess.run(
                [_script(), "detect", "--json", "--from", "-"],
                input=json.dumps({"schema": "hwprofile.host/1"}),
                stdout=f,
                stderr=subprocess.PIPE,
                text=True,
            )
        assert r.returncode == 1 and "cannot write the output" in r.stderr, (r.returncode, r.stderr)


def test_every_command_is_one_shot_or_long_running() -> None:
    import hwprofile.cli as cli

    assert not cli.ONE_SHOT & cli.LONG_RUNNING
    assert {c[0] for c in _commands()} == cli.ONE_SHOT | cli.LONG_RUNNING


@pytest.mark.parametrize("command", ["plan", "detect", "status", "daemon", "launch", "watch", "--version"])
def test_one_shot_commands_collect_garbage_rarely(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """The console script raises the collector's first threshold for the commands that print and
    exit and freezes what is left once their output is flushed; the commands that keep running keep
    the default and freeze nothing (the demo loads torch, whose nanobind extensions report the
    objects left at the exit as leaks)."""
    import gc

    import hwprofile.cli as cli

    events: list[object] = []
    monkeypatch.setattr(sys, "argv", ["hwprofile", command])
    monkeypatch.setattr(cli, "main", lambda: events.append(gc.get_threshold()) or 0)
    monkeypatch.setattr(sys.stdout, "flush", lambda: events.append("flush"))
    monkeypatch.setattr(gc, "freeze", lambda: events.append("freeze"))
    before = gc.get_threshold()
    try:
        assert cli.run() == 0
    finally:
        gc.set_threshold(*before)
    if command in {"plan", "detect", "status"}:
        assert events == [(cli.ONE_SHOT_GC_THRESHOLD, *before[1:]), "flush", "freeze"]
    else:
        assert events == [before, "flush"]


@pytest.mark.parametrize("command", ["detect", "profiles", "plan", "render", "launch"])
def test_a_snapshot_on_standard_input_is_read_once(tmp_path: Path, fake_nvml_dir: Path, command: str) -> None:
    """``--from -`` (documented: a snapshot on stdin) failed for plan, render and launch ("-:1:1:
    invalid JSON"): the snapshot was read twice, the second time from an empty stdin."""
    host = build("rtx4090-1x", tmp_path / "h")
    env = cli_env(host, fake_nvml_dir)
    snap = subprocess.run([_script(), "detect", "--json"], env=env, capture_output=True, text=True)
    assert snap.returncode == 0, snap.stderr
    extra = {
        "plan": ["--json"],
        "render": ["--vllm-version", "0.32.0", "--format", "json"],
        "launch": ["--dry-run"],
        "profiles": ["--json"],
        "detect": ["--json"],
    }[command]
    r = subprocess.run(
        [_script(), command, "--from", "-", *extra],
        input=snap.stdout,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "invalid JSON" not in r.stderr and r.stdout.strip()


def test_a_snapshot_piped_in_without_from_is_said_not_read(tmp_path: Path, fake_nvml_dir: Path) -> None:
    """A newcomer pipes a saved snapshot into ``plan`` and forgets ``--from -``: the plan is of this host
    (stdin is never read without it), and stderr says so and what to add; with ``--from -``, with
    nothing on stdin, or with something other than a snapshot ahead on it, no such line."""
    host = build("rtx4090-1x", tmp_path / "h")
    env = cli_env(host, fake_nvml_dir)
    snap = tmp_path / "snap.json"
    got = subprocess.run([_script(), "detect", "--json"], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    snap.write_text(got.stdout)
    said = "standard input is not read: to use a snapshot piped in, add --from -"

    def plan(*extra: str, stdin: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_script(), "plan", "--json", *extra], stdin=stdin, env=env, capture_output=True, text=True
        )

    with snap.open() as f:  # `hwprofile plan < snap.json`
        assert said in plan(stdin=f).stderr
    import os

    data = got.stdout.encode()
    assert len(data) < 60_000  # it fits a pipe's buffer: written whole before the command starts
    r_fd, w_fd = os.pipe()  # `cat snap.json | hwprofile plan`
    os.write(w_fd, data)
    os.close(w_fd)
    with os.fdopen(r_fd) as pipe:
        assert said in plan(stdin=pipe).stderr
    with snap.open() as f:
        r = plan("--from", "-", stdin=f)
    assert r.returncode == 0 and said not in r.stderr, r.stderr
    assert said not in plan(stdin=subprocess.DEVNULL).stderr
    r_fd, w_fd = os.pipe()  # `true | hwprofile plan`, `ssh -n`: a pipe at its end, nothing piped in
    os.close(w_fd)
    with os.fdopen(r_fd) as pipe:
        assert said not in plan(stdin=pipe).stderr
    script = tmp_path / "run.sh"  # `bash < run.sh`: what is ahead on stdin is the script, not a snapshot
    script.write_text("hwprofile plan --json\necho done\n")
    with script.open() as f:
        assert said not in plan(stdin=f).stderr
