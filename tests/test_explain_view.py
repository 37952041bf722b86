"""`hwprofile plan --explain` as a newcomer reads it (issue 31, item 6): run from inside the checkout on the
shipped example hosts and on a CPU-only host. What one asks first comes first; identical instances are
folded; paths are shown relative to a legend; no Python value (None, True, tuples) reaches the page; a CPU
plan has no GPU lines; a TTFT over its target is never called within it; the JSON is not the view's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import runcli

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ROOT / "examples" / "hosts"
NAMES = sorted(p.stem for p in HOSTS.glob("*.json"))
PACKAGE = ROOT / "hwprofile"
MODEL = "Qwen/Qwen3-8B"  # a catalog model every example host fits (12 GB included)


def hw(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The command as a newcomer types it, from inside the checkout."""
    return runcli.hwprofile(*args, env=env, cwd=ROOT, timeout=120)


@pytest.fixture
def env(empty_root: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")},
        "HWPROFILE_CONFIG_ROOT": str(empty_root),
    }


def no_python_values(text: str) -> list[str]:
    """Lines that show a Python value instead of words."""
    bad = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|\(\(|\[\[|\(from None\)|NUMA node None")
    return [ln for ln in text.splitlines() if bad.search(ln)]


def ttft_called_within(text: str, target: float) -> list[str]:
    """Clauses that give a TTFT over the target and call it within the targets."""
    out = []
    for clause in re.split(r"[;\n]", text):
        m = re.search(r"TTFT (\d+(?:\.\d+)?) ms", clause)
        if m and float(m.group(1)) > target and "within the targets" in clause and "NOT within" not in clause:
            out.append(clause.strip())
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_example_host_explains_in_words(name: str, env: dict[str, str]) -> None:
    host = str(HOSTS / f"{name}.json")
    for level in ("--explain", "--explain=all"):
        r = hw(env, "plan", "--from", host, "--model", MODEL, level)
        assert r.returncode == 0, r.stderr
        text = r.stdout
        assert text.splitlines()[0].startswith("Runs "), text[:300]  # what runs, first
        assert [ln.split()[0] for ln in text.splitlines()[:4]] == ["Runs", "URL", "Fits", "Speed"], text[:600]
        assert not no_python_values(text), no_python_values(text)
        assert str(PACKAGE) + "/" not in text and str(ROOT / "profiles") + "/" not in text  # relative, legend
        if "profiles/" in text:
            assert f"profiles/      {ROOT / 'profiles'} (the built-in profiles)" in text
        if "[default]" in text:
            assert "default        hwprofile's own default" in text
        assert "<config root>/" not in text or f"<config root>/ {env['HWPROFILE_CONFIG_ROOT']}" in text
        target = float(re.search(r"TTFT <= (\d+(?:\.\d+)?) ms", text).group(1))
        assert not ttft_called_within(text, target), ttft_called_within(text, target)
    short = hw(env, "plan", "--from", host, "--model", MODEL, "--explain").stdout
    full = hw(env, "plan", "--from", host, "--model", MODEL, "--explain=all").stdout
    assert len(short.splitlines()) < len(full.splitlines()) and "--explain=all" in short
    assert "Reasons" in full and "decode step:" in full and "decode step:" not in short


def test_the_4x_a800_folds_its_two_identical_instances(env: dict[str, str]) -> None:
    host = str(HOSTS / "a800-pcie-4x.json")
    text = hw(env, "plan", "--from", host, "--explain=all").stdout
    print(text)
    assert "2 instances like this, each as below:" in text
    assert "  vllm-gpu0-1: GPU 0,1, NUMA node 0, http://127.0.0.1:8000" in text
    assert "  vllm-gpu2-3: GPU 2,3, NUMA node 1, http://127.0.0.1:8001" in text
    assert text.count("max_model_len            8192") == 1  # one block, not one per instance
    assert text.count("engine.max_model_len = 8192  (every instance)") == 1
    assert text.count("decode step: weights + KV over bandwidth") == 1
    assert "each instance: TTFT" in text
    # the KV-capacity warning once, for both instances (its numbers follow the predictions)
    assert (
        len(re.findall(r"max_num_seqs \d+ > \d+ \(the KV cache holds", text)) == 1
        and "(every instance)" in text
    )
    assert "k by batch: 5 at 1-8 running sequences, 3 at 9-64, 1 at 65 and more" in text
    # twelve batchings that all predict the same are one line, said to change nothing
    grid = [ln for ln in text.splitlines() if re.match(r"\s+(=>)?\d+/\d+", ln)]
    assert len(grid) == 1 and "no batching changes the prediction at 16 requests in flight" in text, grid
    # was 137 for less (every reason twice, a 4-line grid); the simulated figures, the power lever and the
    # MoE kernel reasons came since, and the request's latency outside the engine (a term of its own)
    assert len(text.splitlines()) < 125
    short = hw(env, "plan", "--from", host, "--explain").stdout
    assert len(short.splitlines()) < 90


def test_the_json_is_not_the_views(env: dict[str, str]) -> None:
    host = str(HOSTS / "a800-pcie-4x.json")
    plain = json.loads(hw(env, "plan", "--from", host, "--json").stdout)
    explained = json.loads(hw(env, "plan", "--from", host, "--json", "--explain=all").stdout)
    assert (
        plain == explained and plain["reasons"] and plain["instances"][0]["engine"]["max_model_len"] == 8192
    )


def test_a_cpu_plan_has_no_gpu_lines(tmp_path: Path, env: dict[str, str]) -> None:
    from fakehost import build

    host = build("no-driver", tmp_path / "h")
    cpu_env = {**host.env(None), "HWPROFILE_CONFIG_ROOT": env["HWPROFILE_CONFIG_ROOT"]}
    r = hw(cpu_env, "plan", "--model", "Qwen/Qwen3-0.6B", "--explain")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    print(text)
    assert "Runs     Qwen/Qwen3-0.6B (16-bit): 1 vLLM server on the CPU" in text
    assert (
        "Fits     RAM 2.1 GiB planned: weights 1.1 GiB, KV cache 1.0 GiB (9344 tokens)" in text
        and "memory (RAM)" in text
    )
    assert "per GPU" not in text and "gpu_memory_utilization" not in text and "NUMA" not in text
    assert "Speed    not predicted for a CPU server" in text and "Predictions at" not in text
    assert not no_python_values(text), no_python_values(text)
    assert "kv_cache_memory_bytes    1.0 GiB (1073741824)" in text


def test_the_headline_counts_every_gpu_of_a_data_parallel_server(env: dict[str, str]) -> None:
    """One API server in front of 2 data-parallel ranks of TP 2 runs on 4 GPUs: the headline says 4 and
    the layout, as the instance's own lines do (it said "2 GPUs" for the four); TP servers say their TP."""
    dp = hw(env, "plan", "--from", str(HOSTS / "a800-pcie-4x.json"), "--model", "Qwen/Qwen3.8-27B")
    assert dp.returncode == 0, dp.stderr
    head = dp.stdout.splitlines()[0]
    assert "1 vLLM server on GPU 0,1,2,3" in head and "tensor parallel 2, data parallel 2" in dp.stdout
    assert head.endswith("4 GPUs (data parallel 2 x tensor parallel 2)"), head
    tp = hw(env, "plan", "--from", str(HOSTS / "rtx3090-2x.json"), "--model", "Qwen/Qwen3.8-27B")
    assert tp.stdout.splitlines()[0].endswith("1 vLLM server on GPU 0,1 (NVIDIA GeForce RTX 3090), 2 GPUs")
