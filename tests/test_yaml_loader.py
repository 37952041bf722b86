"""The YAML loader: a file gives what its text gives, the line of every key, errors with file and
line; and planning, which reads the profiles through it, writes nothing and imports nothing heavy."""

from __future__ import annotations

import datetime
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hwprofile.config import ConfigError, yamlsrc

TEXT = "engine:\n  max_model_len: 4096\n  kv_cache_dtype: auto\nspeculative:\n  method: ngram\nrules:\n  - a\n  - b\n"


def test_a_file_gives_its_data_and_the_line_of_every_key(tmp_path: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    data, locs = yamlsrc.load_file(f)
    assert (data, locs) == yamlsrc.load_text(TEXT, str(f))
    assert data["engine"]["max_model_len"] == 4096 and data["rules"] == ["a", "b"]
    assert locs == {
        ("engine",): 1,
        ("engine", "max_model_len"): 2,
        ("engine", "kv_cache_dtype"): 3,
        ("speculative",): 4,
        ("speculative", "method"): 5,
        ("rules",): 6,
        ("rules", "0"): 7,
        ("rules", "1"): 8,
    }
    assert yamlsrc.source_of("overrides", str(f), locs, ("speculative", "method", "x")).line == 5


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text(TEXT)
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 4096
    f.write_text(TEXT.replace("4096", "8192"))  # same size, same timestamp tick
    assert yamlsrc.load_file(f)[0]["engine"]["max_model_len"] == 8192


def test_values_keep_their_yaml_types(tmp_path: Path) -> None:
    f = tmp_path / "o.yaml"
    f.write_text("k_table: {1: 5, 9: 3}\nwhen: 2024-01-01\nx: .nan\n")
    data = yamlsrc.load_file(f)[0]
    assert data["k_table"] == {1: 5, 9: 3}
    assert data["when"] == datetime.date(2024, 1, 1)
    assert math.isnan(data["x"])


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("engine:\n  max_model_len: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: invalid YAML"):
        yamlsrc.load_file(f)
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read"):
        yamlsrc.load_file(tmp_path / "nope.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 9\)"):
        yamlsrc.load_file(tmp_path / "latin1.yaml")


def test_plan_writes_nothing_and_imports_nothing_heavy(
    tmp_path: Path, fake_nvml_dir: Path, empty_root: Path
) -> None:
    """A pure planner: `hwprofile plan` leaves the home and cache folders as they were, and never
    imports vllm, torch or jinja2 (nor difflib, only needed for error suggestions, nor logging, only
    for the daemon's and launch's own log)."""
    from fakehost import build

    host = build("a800-pcie-4x-2numa", tmp_path / "h")
    home, cache = tmp_path / "home", tmp_path / "xdg-cache"
    home.mkdir()
    cache.mkdir()
    env = {
        **host.env(fake_nvml_dir),
        "HWPROFILE_CONFIG_ROOT": str(empty_root),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(cache),
    }
    code = (
        "import sys, io, contextlib\n"
        "before = set(sys.modules)\n"
        "from hwprofile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out: rc = main(['plan', '--json'])\n"
        "assert rc == 0, rc\n"
        "heavy = ('vllm', 'torch', 'transformers', 'jinja2', 'difflib', 'logging')\n"
        "print(sorted(m for m in heavy if m in set(sys.modules) - before))\n"
        "print(out.getvalue())\n"
    )
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "[]"
        assert '"builtin ' in r.stdout and "base.yaml:" in r.stdout  # provenance: file:line
    assert list(home.iterdir()) == [] and list(cache.iterdir()) == []
