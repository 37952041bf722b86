"""The planner's KV bytes per token equal what vLLM itself computes: for a fixed KV byte budget, vLLM
resolves (and logs) ``KV cache size: N tokens``; the plan predicts the same N, for two model shapes.
The engines are built as ``vllm serve`` builds them (tests/vllm_engines.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import build
from vllmtools import engine_kv, kv_args, require_vllm

from hwprofile.plan.memory import vllm_reported_kv_tokens

pytestmark = pytest.mark.slow(minutes=1)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BUDGET = 64 * 2**20  # bytes of KV cache given to vLLM

SHAPES = {
    # name: (config overrides of the tiny model, max_model_len). Head sizes vLLM's CPU attention
    # supports. vLLM logs max_concurrency x max_model_len (concurrency = blocks // blocks per request);
    # at max_model_len = the CPU block size (128 tokens) that is exactly the block capacity.
    "2 layers, 2 KV heads of 32": ({}, 256),
    "3 layers, 1 KV head of 64": (
        {"hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1},
        128,
    ),
}


def test_planner_kv_tokens_match_vllm(tmp_path: Path, fake_nvml_dir: Path) -> None:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    host = build("no-driver", tmp_path / "host")  # CPU-only: the plan uses a fixed KV space
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")}
    cases = []
    memory = {}
    for i, (name, (cfg, max_len)) in enumerate(SHAPES.items()):
        model = make_tiny_model(tmp_path / f"model{i}", config=cfg)
        plan = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "plan",
                "--json",
                "--model",
                str(model),
                "--set",
                f"cpu.kv_cache_space_gib={BUDGET / 2**30}",
                "--set",
                "speculative.method=none",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert plan.returncode == 0, plan.stderr
        inst = json.loads(plan.stdout)["instances"][0]
        assert inst["engine"]["kv_cache_memory_bytes"] == BUDGET
        memory[name] = (max_len, inst["memory"])
        cases.append((name, model, kv_args(max_len, BUDGET)))
    settled = engine_kv(cases, tmp_path / "run")
    for name, (max_len, mem) in memory.items():
        vllm_tokens = settled[name].kv_tokens
        assert mem["block_size"] == settled[name].block_size == 128  # vLLM's CPU block size
        assert vllm_reported_kv_tokens(mem["kv_tokens"], max_len, mem["block_size"]) == vllm_tokens, (
            name,
            mem,
            vllm_tokens,
        )
        if max_len == mem["block_size"]:
            assert mem["kv_tokens"] == vllm_tokens  # the raw block capacity, exactly
