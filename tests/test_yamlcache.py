"""The YAML parse cache: same answers as parsing, never stale, never for data JSON would change,
and a warm `hwprofile plan` that does not import PyYAML at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwprofile.config import ConfigError, yamlsrc

TEXT = "engine:\n  max_model_len: 4096\n  kv_cache_dtype: auto\nspeculative:\n  method: ngram\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(d))
    monkeypatch.setattr(yamlsrc, "SETTLE_NS", 0)  # files written by the test may be cached at once
    return d / "yaml"


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json")) if cache.is_dir() else []


def test_second_load_comes_from_the_cache_with_the_same_lines(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    parsed = yamlsrc.load_file(f)
    assert parsed == yamlsrc.load_text(TEXT, str(f))
    [entry] = _entries(cache)
    doc = json.loads(entry.read_text())  # plain JSON, never pickle
    assert doc["data"] == parsed[0]
    doc["data"]["engine"]["max_model_len"] = 1  # prove the next load reads the entry
    entry.write_text(json.dumps(doc))
    data, locs = yamlsrc.load_file(f)
    assert data["engine"]["max_model_len"] == 1
    assert locs == parsed[1] and locs[("speculative", "method")] == 5
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    yamlsrc.load_file(f)
    f.write_text(TEXT.replace("4096", "8192"))  # same size
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 8192
    f.write_text(TEXT.replace("4096", "2048"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back: ctime still differs
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 2048


def test_fresh_files_are_not_cached(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlsrc, "SETTLE_NS", 2_000_000_000)
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 4096
    assert _entries(cache) == []


@pytest.mark.parametrize(
    "text",
    ["k_table: {1: 5, 9: 3}\n", "when: 2024-01-01\n", "x: .nan\n"],
    ids=["int keys", "date", "nan"],
)
def test_data_json_would_change_is_not_cached(tmp_path: Path, cache: Path, text: str) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(text)
    first = yamlsrc.load_file(f)[0]
    assert _entries(cache) == []
    again = yamlsrc.load_file(f)[0]
    assert type(next(iter(again.values()))) is type(next(iter(first.values())))


def test_broken_entries_and_off_switch(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    yamlsrc.load_file(f)
    [entry] = _entries(cache)
    entry.write_text("{not json")
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 4096
    assert json.loads(entry.read_text())["data"]["engine"]["max_model_len"] == 4096  # rewritten
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", "off")
    entry.unlink()
    yamlsrc.load_file(f)
    assert _entries(cache) == []


def test_errors_still_name_file_and_line(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("engine:\n  max_model_len: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: invalid YAML"):
        yamlsrc.load_file(f)
    assert _entries(cache) == []
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read"):
        yamlsrc.load_file(tmp_path / "nope.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 9\)"):
        yamlsrc.load_file(tmp_path / "latin1.yaml")


def test_warm_plan_imports_no_yaml_typing_or_pathlib(
    tmp_path: Path, fake_nvml_dir: Path, empty_root: Path
) -> None:
    """`hwprofile plan` has a 150 ms budget: with the parse cache warm it needs no PyYAML (30-40 ms
    to import on small VMs), and it never imports typing or pathlib (5-15 ms each)."""
    from fakehost import build

    host = build("a800-pcie-4x-2numa", tmp_path / "h")
    env = {
        **host.env(fake_nvml_dir),
        "HWPROFILE_CONFIG_ROOT": str(empty_root),
        "HWPROFILE_CACHE_DIR": str(tmp_path / "cache"),
    }
    code = (
        "import sys, io, contextlib\n"
        "before = set(sys.modules)\n"
        "from hwprofile.config import yamlsrc\n"
        "yamlsrc.SETTLE_NS = 0\n"
        "from hwprofile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out: rc = main(['plan', '--json'])\n"
        "assert rc == 0, rc\n"
        "heavy = ('vllm', 'torch', 'jinja2', 'yaml', 'typing', 'pathlib', 'difflib')\n"
        "print(sorted(m for m in heavy if m in set(sys.modules) - before))\n"
        "print(out.getvalue())\n"
    )
    cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert cold.returncode == 0, cold.stderr
    assert "'yaml'" in cold.stdout.splitlines()[0]  # the first run parses
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.splitlines()[0] == "[]"
    # the same plan byte for byte, provenance (file:line of every value) included
    assert warm.stdout.split("\n", 1)[1] == cold.stdout.split("\n", 1)[1]
    assert '"builtin ' in warm.stdout and "base.yaml:" in warm.stdout


def test_entries_others_could_write_are_ignored(tmp_path: Path, cache: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    yamlsrc.load_file(f)
    [entry] = _entries(cache)
    assert oct(entry.stat().st_mode & 0o777) == "0o600"
    doc = json.loads(entry.read_text())
    doc["data"]["engine"]["max_model_len"] = 1  # a planted answer
    entry.write_text(json.dumps(doc))
    entry.chmod(0o666)
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 4096  # parsed, not taken
    if os.getuid() == 0:  # another owner (root can hand the file over to test it)
        [entry] = _entries(cache)
        entry.write_text(json.dumps(doc))
        entry.chmod(0o600)
        os.chown(entry, 4242, 4242)
        assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 4096
