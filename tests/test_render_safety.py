"""What `hwprofile render` writes holds exactly what was planned: hostile values (tests/hostile/render)
as a model directory name, a setting and the API key cannot add a line, key, directive or variable to
the systemd unit, the vLLM --config YAML or the environment file, and every file read back with the
format's own parser (systemd itself, yaml.safe_load, systemd's env-file rules and bash/dash) gives the
planned values back. --env-file is plain text. Files are written atomically and never through links,
also against links another user plants; instance names never leave --output DIR."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from system import analyze_verify

from hwprofile.cli import main
from hwprofile.render import output

HERE = Path(__file__).resolve().parent
CASES: list[dict[str, str]] = json.loads((HERE / "hostile" / "render" / "values.json").read_text())
IDS = [c["name"] for c in CASES]
VERSION = "0.11.0"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SYSTEMD = "/usr/lib/systemd/systemd"
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def _has_cc(value: str) -> bool:
    return any(c < " " or c == "\x7f" for c in value)


# -- the world: a saved CPU host, a config root, model directories, all readable by nobody ----------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, fake_nvml_dir: Path):
    from fakehost import build

    host = build("no-driver", tmp_path_factory.mktemp("host"))
    # Under /tmp and 0755 (pytest's own tmp dirs are 0700): nobody reads these in the setpriv cases.
    base = Path(tempfile.mkdtemp(prefix="hwprofile-safety-", dir="/tmp"))
    base.chmod(0o755)
    snap = base / "host.json"
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "detect", "--json"],
        env=host.env(fake_nvml_dir),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    snap.write_text(r.stdout)
    root = base / "etc-hwprofile"
    root.mkdir()
    envfile = base / "inst.env"
    envfile.write_text("VLLM_NO_USAGE_STATS=1\n")
    vllm = Path(sys.executable).parent / "vllm"
    exe = str(vllm if vllm.exists() else Path(sys.executable))
    for p in (snap, envfile):
        p.chmod(0o644)
    root.chmod(0o755)
    yield SimpleNamespace(base=base, snap=snap, root=root, envfile=envfile, exe=exe)
    shutil.rmtree(base, ignore_errors=True)


def _model(world, name: str, value: str) -> str:
    """A tiny model directory whose path ends in ``value`` (a ``/`` in it makes subdirectories)."""
    d = world.base / "models" / name / value
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY))
    return str(world.base / "models" / name) + "/" + value


def _render(world, capsys, *args: str) -> tuple[int, str, str]:
    argv = [
        "render",
        "--from",
        str(world.snap),
        "--config-root",
        str(world.root),
        "--vllm-version",
        VERSION,
        "--set",
        f"server.vllm_command={world.exe}",
        "--env-file",
        str(world.envfile),
        *args,
    ]
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _inputs(world, case: dict[str, str], where: str) -> list[str]:
    if where == "model":
        return ["--model", _model(world, case["name"], case["value"])]
    return ["--model", _model(world, "plain", "tiny"), "--set", f"server.served_model_name={case['value']}"]


# -- readers: each format read back by its own rules ------------------------------------------------

_C = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}


def systemd_dump_words(line: str) -> list[str]:
    """The words of a ``Command Line:`` line of systemd's own dump (``systemd --test``), which prints
    the argv it parsed with shell-style quoting and C escapes (escape.c, shell_maybe_quote)."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        cur = bytearray()
        while i < len(line) and line[i] != " ":
            if line[i] != '"':
                cur += line[i].encode()
                i += 1
                continue
            i += 1
            while line[i] != '"':
                c = line[i]
                if c != "\\":
                    cur += c.encode()
                    i += 1
                    continue
                e = line[i + 1]
                if e in _C:
                    cur.append(_C[e])
                    i += 2
                elif e == "x":
                    cur.append(int(line[i + 2 : i + 4], 16))
                    i += 4
                elif e in "01234567":
                    cur.append(int(line[i + 1 : i + 4], 8))
                    i += 4
                elif e == "u":
                    cur += chr(int(line[i + 2 : i + 6], 16)).encode()
                    i += 6
                else:  # \\ \" \$ \`
                    cur += e.encode()
                    i += 2
            i += 1
        words.append(cur.decode())
    return words


def systemd_dump(units: dict[str, str], tmp: Path) -> dict[str, dict[str, Any]]:
    """Load ``units`` (name → text) with systemd's own unit loader (``systemd --test``, which
    refuses to run as root: as nobody) and return per unit its ExecStart argv as systemd parsed it
    (before exec-time ``$`` expansion) and its other dumped properties."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="hwprofile-units-"))
    try:
        d.chmod(0o755)
        for t in ("sysinit", "basic", "shutdown", "network-online", "multi-user"):
            (d / f"{t}.target").write_text(f"[Unit]\nDescription={t}\n")
        (d / "system.slice").write_text("[Unit]\nDescription=slice\n")
        (d / "all.target").write_text("[Unit]\nDescription=all\nWants=" + " ".join(units) + "\n")
        for name, text in units.items():
            (d / name).write_text(text)
        for p in d.iterdir():
            p.chmod(0o644)
        r = subprocess.run(
            [
                *NOBODY,
                "env",
                "SYSTEMD_LOG_TARGET=console",
                f"SYSTEMD_UNIT_PATH={d}",
                SYSTEMD,
                "--test",
                "--system",
                "--unit=all.target",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        dump = r.stdout + r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out: dict[str, dict[str, Any]] = {}
    for chunk in re.split(r"^\t-> Unit ", dump, flags=re.M)[1:]:
        name, _, body = chunk.partition(":\n")
        if name not in units:
            continue
        lines = body.split("\n")  # never splitlines(): a raw U+2028 in the dump is not a line end
        props: dict[str, list[str]] = {}
        argv: list[list[str]] = []
        for ln in lines:
            s = ln.strip("\t")
            if s.startswith("Command Line: "):
                argv.append(systemd_dump_words(s[len("Command Line: ") :]))
            elif ": " in s:
                k, _, v = s.partition(": ")
                props.setdefault(k, []).append(v)
        out[name] = {"argv": argv, "props": props}
    return out


def systemd_exec_word(word: str) -> str:
    """What exec gives the program for a parsed ExecStart= word of ours: ``$$`` is a literal ``$``;
    a lone ``$`` would be a variable, which our quoting never leaves."""
    assert "$" not in word.replace("$$", ""), f"unescaped $ reaches exec: {word!r}"
    return word.replace("$$", "$")


def unit_lines(text: str) -> list[tuple[str, str]]:
    """(section, key) of every directive, by systemd.syntax(7): comment lines, sections, KEY=."""
    out, section = [], ""
    assert "\r" not in text
    lines = text.split("\n")
    for ln in lines:
        assert not ln.endswith("\\"), f"line continues into the next: {ln!r}"
        s = ln.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            section = s
            continue
        out.append((section, s.split("=", 1)[0]))
    return out


def systemd_env_file(text: str, old_comments: bool = False) -> dict[str, str]:
    """systemd's EnvironmentFile= reader: parse_env_file_internal (src/basic/env-file.c) step by
    step, then the checks exec applies (valid name, UTF-8 without control characters but tab and
    newline, else the variable is dropped). ``old_comments``: before v254 a backslash in a comment
    escaped the next character, a newline included."""
    out: dict[str, str] = {}
    NEWLINE, WS, COMMENTS, NEED_ESCAPE = "\n\r", " \t\n\r", "#;", '"\\`$'
    state, key, value, lkw, lvw = "PRE_KEY", "", None, None, None

    def push() -> None:
        k = key if lkw is None else key[:lkw]
        out[k] = value or ""

    for c in text:
        if state == "PRE_KEY":
            if c in COMMENTS:
                state = "COMMENT"
            elif c not in WS:
                state, key, lkw = "KEY", c, None
        elif state == "KEY":
            if c in NEWLINE:
                state, key = "PRE_KEY", ""
            elif c == "=":
                state, lvw = "PRE_VALUE", None
            else:
                if c not in WS:
                    lkw = None
                elif lkw is None:
                    lkw = len(key)
                key += c
        elif state == "PRE_VALUE":
            if c in NEWLINE:
                push()
                state, key, value = "PRE_KEY", "", None
            elif c == "'":
                state = "SQ"
            elif c == '"':
                state = "DQ"
            elif c == "\\":
                state = "VALUE_ESCAPE"
            elif c not in WS:
                state, value = "VALUE", (value or "") + c
        elif state == "VALUE":
            if c in NEWLINE:
                if lvw is not None:
                    value = (value or "")[:lvw]
                push()
                state, key, value = "PRE_KEY", "", None
            elif c == "\\":
                state, lvw = "VALUE_ESCAPE", None
            else:
                if c not in WS:
                    lvw = None
                elif lvw is None:
                    lvw = len(value or "")
                value = (value or "") + c
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            if c not in NEWLINE:
                value = (value or "") + c
        elif state == "SQ":
            if c == "'":
                state = "PRE_VALUE"
            else:
                value = (value or "") + c
        elif state == "DQ":
            if c == '"':
                state = "PRE_VALUE"
            elif c == "\\":
                state = "DQ_ESCAPE"
            else:
                value = (value or "") + c
        elif state == "DQ_ESCAPE":
            state = "DQ"
            if c in NEED_ESCAPE:
                value = (value or "") + c
            elif c != "\n":
                value = (value or "") + "\\" + c
        elif state == "COMMENT":
            if c == "\\":
                state = "COMMENT_ESCAPE"
            elif c in NEWLINE:
                state = "PRE_KEY"
        elif state == "COMMENT_ESCAPE":
            state = "COMMENT" if (old_comments or c not in NEWLINE) else "PRE_KEY"
    if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE", "SQ", "DQ", "DQ_ESCAPE"):
        if state == "VALUE" and lvw is not None:
            value = (value or "")[:lvw]
        push()
    for k, v in out.items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k), f"systemd would drop {k!r}"
        assert not any((ch < " " or ch == "\x7f") and ch not in "\t\n" for ch in v), f"systemd drops {k}"
    return out


def shell_env_file(path: Path, shell: str) -> dict[str, str]:
    """What a POSIX shell makes of ``set -a; . FILE`` (variables exported, read back NUL-separated)."""
    r = subprocess.run(
        ["env", "-i", shell, "-c", 'set -a; . "$1" || exit 9; exec env -0', shell, str(path)],
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0 and not r.stderr, r.stderr
    env = dict(kv.split("=", 1) for kv in r.stdout.decode().split("\0") if kv)
    return {k: v for k, v in env.items() if k not in ("PWD", "OLDPWD", "SHLVL", "_")}


def shell_argv(line: str, shell: str) -> list[str]:
    r = subprocess.run(["env", "-i", shell, "-c", "printf '%s\\0' " + line], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split("\0")[:-1]


# -- renders of every hostile case, as a model directory and as a setting ---------------------------


def _reference(world, capsys, inputs: list[str]) -> dict[str, Any] | None:
    code, out, _ = _render(world, capsys, *inputs, "--format", "json")
    return json.loads(out) if code == 0 else None


@pytest.fixture(scope="module")
def baseline_keys(world) -> list[tuple[str, str]]:
    args = [
        "render",
        "--from",
        str(world.snap),
        "--config-root",
        str(world.root),
        "--vllm-version",
        VERSION,
        "--set",
        f"server.vllm_command={world.exe}",
        "--env-file",
        str(world.envfile),
        "--model",
        _model(world, "plain", "tiny"),
        "--format",
        "systemd",
    ]
    r = subprocess.run([sys.executable, "-m", "hwprofile", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return unit_lines(r.stdout)


@pytest.mark.parametrize("where", ["model", "setting"])
def test_hostile_values_cannot_add_yaml_keys(world, capsys, where) -> None:
    import yaml

    for case in CASES:
        inputs = _inputs(world, case, where)
        ref = _reference(world, capsys, inputs)
        code, out, err = _render(world, capsys, *inputs, "--format", "yaml")
        if where == "setting" and code == 2 and ref is None:
            continue  # the settings layer refused the value (control characters, not a string): fine
        assert code == 0 and ref is not None, (case["name"], err)
        if where == "model":
            assert ref["argv"][ref["argv"].index("serve") + 1] == inputs[1], case["name"]
        loaded = yaml.safe_load(out)
        assert loaded == ref["config"], (case["name"], out)
        assert "trust_remote_code" not in loaded and "trust-remote-code" not in loaded
        assert [ln for ln in out.split("\n") if ln.startswith("#")] == out.split("\n")[:2], case["name"]


@pytest.mark.parametrize("where", ["model", "setting"])
def test_hostile_values_in_the_unit_read_back_by_systemd(
    world, capsys, tmp_path, where, baseline_keys
) -> None:
    if not (shutil.which("setpriv") and os.path.exists(SYSTEMD)):
        pytest.skip("needs setpriv and /usr/lib/systemd/systemd (its --test loader refuses root)")
    units: dict[str, str] = {}
    expected: dict[str, list[str]] = {}
    for i, case in enumerate(CASES):
        inputs = _inputs(world, case, where)
        ref = _reference(world, capsys, inputs)
        code, out, err = _render(world, capsys, *inputs, "--format", "systemd")
        if where == "setting" and code == 2 and ref is None:
            continue
        assert code == 0 and ref is not None, (case["name"], err)
        assert unit_lines(out) == baseline_keys, (case["name"], out)  # no directive added or lost
        name = f"hs{i:02d}-{case['name']}.service"
        units[name] = out
        expected[name] = ref["argv"]
    files = []
    for name, text in units.items():
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    v = analyze_verify(*files)
    assert v.returncode == 0 and v.stderr == "", v.stderr
    dumped = systemd_dump(units, tmp_path)
    assert set(dumped) == set(units)
    for name, d in dumped.items():
        assert len(d["argv"]) == 1, (name, d["argv"])
        assert [systemd_exec_word(w) for w in d["argv"][0]] == expected[name], name
        assert d["props"]["EnvironmentFile"] == [str(world.envfile)], name
        assert d["props"].get("User") == [name.removesuffix(".service")], name  # DynamicUser=, no User=


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hostile_api_key_reads_back_alike_from_systemd_and_shells(
    world, capsys, tmp_path, monkeypatch, case
) -> None:
    monkeypatch.setenv("HWPROFILE_SERVER__API_KEY_ENV", "MY_VLLM_KEY")
    monkeypatch.setenv("MY_VLLM_KEY", case["value"])
    inputs = _inputs(world, case, "model")
    ref = _reference(world, capsys, inputs)
    out = tmp_path / "out"
    code, _, err = _render(world, capsys, *inputs, "--format", "env", "--output", str(out))
    if any((c < " " or c == "\x7f") and c not in "\t\n" for c in case["value"]):
        assert code == 2 and "control character" in err, err  # systemd would drop the variable
        assert not out.exists() or not list(out.iterdir())
        return
    assert code == 0 and ref is not None, err
    f = out / "vllm-cpu.env"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    want = {**ref["env"], "VLLM_API_KEY": case["value"]}
    text = f.read_text()
    assert systemd_env_file(text) == want
    assert systemd_env_file(text, old_comments=True) == want
    assert shell_env_file(f, "bash") == want
    if shutil.which("dash"):
        assert shell_env_file(f, "dash") == want


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hostile_values_in_the_shell_line(world, capsys, case) -> None:
    inputs = _inputs(world, case, "model")
    ref = _reference(world, capsys, inputs)
    code, out, err = _render(world, capsys, *inputs, "--format", "shell")
    assert code == 0 and ref is not None, err
    assert shell_argv(out, "bash") == ref["argv"]
    if shutil.which("dash"):
        assert shell_argv(out, "dash") == ref["argv"]


def test_non_utf8_model_path_is_refused_not_mangled(world, capsys) -> None:
    raw = os.fsdecode(b"bad-\xff-name")
    model = _model(world, "bytes", raw)
    for fmt in ("systemd", "env", "shell"):
        code, out, err = _render(world, capsys, "--model", model, "--format", fmt)
        if fmt == "env":  # the model is not part of the env file
            assert code == 0, err
            continue
        assert code == 2 and "not valid UTF-8" in err and out == "", (fmt, err)


# -- --env-file is text, not a format string -------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("/etc/x/{0}.env", "/etc/x/{0}.env"),
        ("/etc/x/{name.__class__.__mro__}.env", "/etc/x/{name.__class__.__mro__}.env"),
        ("/etc/x/{}{{name}}{", "/etc/x/{}{vllm-cpu}{"),
        ("/etc/x/{name}-%n.env", "/etc/x/vllm-cpu-%%n.env"),
        ("/etc/x y/{name}.env", "/etc/x y/vllm-cpu.env"),
    ],
)
def test_env_file_is_plain_text(world, capsys, given, written) -> None:
    code, out, err = _render(
        world, capsys, "--model", _model(world, "plain", "tiny"), "--format", "systemd", "--env-file", given
    )
    assert code == 0, err
    assert f"\nEnvironmentFile={written}\n" in out
    assert "__mro__" not in out or "{name.__class__.__mro__}" in out


@pytest.mark.parametrize(
    "given", ["relative/{name}.env", "/etc/x\n[Service]\nUser=root", "/etc/x\r", "/etc/x ", "/x\\"]
)
def test_env_file_systemd_cannot_take_is_refused(world, capsys, given) -> None:
    code, out, err = _render(
        world, capsys, "--model", _model(world, "plain", "tiny"), "--format", "systemd", "--env-file", given
    )
    assert code == 2 and "--env-file" in err and out == "", err


# -- files: atomic, never through links, clean errors ---------------------------------------------


def _render_env(world, capsys, monkeypatch, out: Path) -> tuple[int, str, str]:
    monkeypatch.setenv("HWPROFILE_SERVER__API_KEY_ENV", "MY_VLLM_KEY")
    monkeypatch.setenv("MY_VLLM_KEY", "s3cret-key-value")
    return _render(
        world, capsys, "--model", _model(world, "plain", "tiny"), "--format", "env", "--output", str(out)
    )


def test_output_files_are_atomic_and_0600(world, capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "out"
    code, stdout, err = _render_env(world, capsys, monkeypatch, out)
    assert code == 0, err
    assert stdout.strip() == str(out / "vllm-cpu.env")
    assert [p.name for p in out.iterdir()] == ["vllm-cpu.env"]  # no temporary file left
    f = out / "vllm-cpu.env"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and "VLLM_API_KEY=s3cret-key-value" in f.read_text()
    ino = f.stat().st_ino
    assert _render_env(world, capsys, monkeypatch, out)[0] == 0
    assert f.stat().st_ino != ino  # replaced by rename, not rewritten in place
    code, _, err = _render(
        world, capsys, "--model", _model(world, "plain", "tiny"), "--format", "systemd", "--output", str(out)
    )
    assert code == 0 and stat.S_IMODE((out / "vllm-cpu.service").stat().st_mode) == 0o644


def test_output_dir_that_is_a_file_or_a_dangling_link(world, capsys, monkeypatch, tmp_path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    code, _, err = _render_env(world, capsys, monkeypatch, file)
    assert code == 2 and str(file) in err and "not a directory" in err
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    code, _, err = _render_env(world, capsys, monkeypatch, dangling)
    assert code == 2 and str(dangling) in err and "symbolic link to nothing" in err
    assert not (tmp_path / "nowhere").exists()
    code, _, err = _render_env(world, capsys, monkeypatch, file / "sub")
    assert code == 1 and str(file / "sub") in err and "not a directory" in err


def test_target_that_is_a_link_is_not_written_through(world, capsys, monkeypatch, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    (out / "vllm-cpu.env").symlink_to(victim)
    code, _, err = _render_env(world, capsys, monkeypatch, out)
    assert code == 1 and str(out / "vllm-cpu.env") in err and "symbolic link" in err, err
    assert victim.read_text() == "original\n" and (out / "vllm-cpu.env").is_symlink()


def _nobody_can_run() -> str | None:
    if not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed: cannot act as an unprivileged user"
    if os.geteuid() != 0:
        return "needs root to switch to nobody (uid 65534)"
    return None


def _as_nobody(*cmd: str, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *cmd], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("points_to", ["existing", "new"])
@pytest.mark.parametrize("planted", ["vllm-cpu.env.tmp", "vllm-cpu.env"])
def test_links_planted_by_another_user_never_receive_the_key(
    world, capsys, monkeypatch, tmp_path, planted, points_to
) -> None:
    """nobody plants a link at the old temporary name (DIR/<name>.env.tmp) or at the target name in a
    sticky world-writable directory; root renders the env file with the API key."""
    why = _nobody_can_run()
    if why:
        pytest.skip(why)
    sticky = Path(tempfile.mkdtemp(dir="/tmp", prefix="hwprofile-sticky-"))
    try:
        sticky.chmod(0o1777)  # world-writable and sticky, like /tmp
        victim = tmp_path / "victim"  # root may write it; nobody cannot even reach it
        if points_to == "existing":
            victim.write_text("original\n")
        r = _as_nobody("ln", "-s", str(victim), str(sticky / planted))
        assert r.returncode == 0, r.stderr
        assert (sticky / planted).lstat().st_uid == 65534
        code, _, err = _render_env(world, capsys, monkeypatch, sticky)
        if points_to == "existing":
            assert victim.read_text() == "original\n"
        else:
            assert not victim.exists()
        assert (sticky / planted).is_symlink() and os.readlink(sticky / planted) == str(victim)
        target = sticky / "vllm-cpu.env"
        if planted == "vllm-cpu.env":
            assert code == 1 and "symbolic link" in err and str(target) in err, err
        else:
            assert code == 0, err
            st = target.lstat()
            assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
            assert "VLLM_API_KEY=s3cret-key-value" in target.read_text()
        assert sorted(p.name for p in sticky.iterdir()) == sorted({planted, "vllm-cpu.env"})
    finally:
        shutil.rmtree(sticky, ignore_errors=True)


def test_output_dir_not_writable(world, tmp_path) -> None:
    """--output on a read-only mount (a private mount namespace: root could write anywhere else)."""
    out = tmp_path / "read-only"
    out.mkdir()
    ro = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", ro, str(out), "true"], capture_output=True, text=True
    )
    if not shutil.which("unshare") or probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here (unshare -m): {probe.stderr.strip()}")
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            ro,
            str(out),
            sys.executable,
            "-m",
            "hwprofile",
            "render",
            "--from",
            str(world.snap),
            "--config-root",
            str(world.root),
            "--vllm-version",
            VERSION,
            "--model",
            _model(world, "plain", "tiny"),
            "--format",
            "systemd",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert str(out / "vllm-cpu.service") in r.stderr and "Read-only file system" in r.stderr
    assert "Traceback" not in r.stderr and list(out.iterdir()) == []


# -- instance names never leave --output DIR ------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../evil", "a/b", "..", ".hidden", "x/../../y", "/abs", "evil\nname", "", "a..b", "x" * 101]
)
def test_unsafe_instance_names_are_refused(world, capsys, monkeypatch, tmp_path, name) -> None:
    from hwprofile.render import translate

    real = translate.render_instance
    monkeypatch.setattr(translate, "render_instance", lambda *a, **k: real(*a, **k)._replace(name=name))
    out = tmp_path / "a" / "b" / "out"
    before = sorted(p for p in tmp_path.rglob("*"))
    for fmt in output.FORMATS:
        code, _, err = _render(
            world, capsys, "--model", _model(world, "plain", "tiny"), "--format", fmt, "--output", str(out)
        )
        assert code == 2 and "instance name" in err, (fmt, err)
    assert sorted(p for p in tmp_path.rglob("*")) == before
    with pytest.raises(output.UnsafeValue):
        output.output_path(out, name, "env")


def test_safe_instance_names_stay_in_the_directory(tmp_path) -> None:
    for name in ("vllm-gpu0-1", "vllm-cpu", "a.b@c:d_e"):
        assert Path(output.output_path(tmp_path, name, "systemd")).parent == tmp_path


# -- the templates' last guard and the check cache ---------------------------------------------------


def test_a_raw_line_break_never_leaves_a_template(world) -> None:
    import jinja2

    env = output.environment()
    tpl = env.from_string("Description={{ text }}\n")
    with pytest.raises(output.UnsafeValue):
        tpl.render(text="x\nUser=root")
    with pytest.raises(output.UnsafeValue):
        tpl.render(text="x\u2028y")
    assert tpl.render(text="x y") == "Description=x y\n"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_check_cache_is_written_atomically_not_through_links(tmp_path, monkeypatch) -> None:
    from hwprofile.render import check

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    line = 'HWPROFILE-CHECK {"ok": true, "stage": "done", "message": "", "vllm_version": "9.9.9"}'
    monkeypatch.setattr(
        check.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=line + "\n", stderr=""),
    )
    res = check.check_args(["--max-model-len", "64"], "m", "9.9.9", {})
    assert res.ok and not res.cached
    (entry,) = (tmp_path / "cache" / "hwprofile" / "check" / "9.9.9").iterdir()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    entry.unlink()
    entry.symlink_to(victim)
    res = check.check_args(["--max-model-len", "64"], "m", "9.9.9", {}, use_cache=False)
    assert res.ok and victim.read_text() == "original\n" and entry.is_symlink()
