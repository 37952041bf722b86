"""The planner's KV arithmetic equals what real vLLM (CPU) resolves and logs, per architecture family.

For each family a tiny random-weight model is saved with transformers' own config and model
classes (so config.json has the family's real keys), its engine built as ``vllm serve`` builds it
(tests/vllm_engines.py) with a fixed ``--kv-cache-memory-bytes``, and vLLM's KV capacity (the figure
of its ``KV cache size: N tokens`` line) and block size are compared with
:func:`hwprofile.plan.memory.vllm_kv_cache` over the facts hwprofile reads from that config.json.
Head sizes are ones vLLM's CPU attention supports (MLA: 512 + 64, what its AMX MLA kernel takes).
The KV block size is not assumed: it is what :func:`hwprofile.plan.cpu.cpu_attention` (vLLM's
own rule) says for each model on this machine's CPU, as the planner does from a snapshot's flags
(MLA: 128-token blocks on the AMX MLA kernel, 16 on the reference CPU_MLA kernel without AMX).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from vllmtools import engine_kv, kv_args, make_transformers_model, require_vllm

from hwprofile.host.linux import parse_cpuinfo
from hwprofile.model import read_model_dir
from hwprofile.plan.cpu import cpu_attention
from hwprofile.plan.memory import vllm_kv_cache

pytestmark = pytest.mark.slow(minutes=5.5)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BUDGET = 64 * 2**20  # bytes of KV cache given to vLLM
BATCHED = 128  # --max-num-batched-tokens: the in-flight tokens a sliding window layer also holds

# name: (transformers config class, model class, config kwargs, max_model_len)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], int]] = {
    # explicit head_dim (64) != hidden / heads (32)
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
        },
        256,
    ),
    # GQA 4:1, qkv bias, no sliding window
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "use_sliding_window": False,
        },
        384,
    ),
    # 8 experts, 2 per token, one dense layer
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [0],
        },
        256,
    ),
    # MLA: kv_lora_rank 512 + qk_rope_head_dim 64 = one 576-element latent per token and layer
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "kv_lora_rank": 512,
            "q_lora_rank": None,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
        },
        256,
    ),
    # 5 sliding-window layers (window 128) per full-attention layer
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "sliding_window": 128,
            "sliding_window_pattern": 6,
        },
        1024,
    ),
    # a model-level sliding window (128) on every layer: one group of sliding-window layers
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "sliding_window": 128,
        },
        1024,
    ),
    # window - 1 = 128, the CPU's block: the window spans three blocks (two plus the unaligned one)
    "mistral_w129": (
        "MistralConfig",
        "MistralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "sliding_window": 129,
        },
        1024,
    ),
    # window = max_model_len: the request's own blocks plus one
    "mistral_len": (
        "MistralConfig",
        "MistralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "sliding_window": 1024,
        },
        1024,
    ),
    # max_model_len = one 128-token block: 2 blocks per request where full attention takes 1
    "mistral_blk": (
        "MistralConfig",
        "MistralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "sliding_window": 4096,
        },
        128,
    ),
    # issue 32's case: every layer a 128-token window at max_model_len 128 (one CPU block): the window
    # and the batch in flight reach max_model_len, 2 blocks per request; vLLM logs half the blocks' tokens
    "mistral_w128_len128": (
        "MistralConfig",
        "MistralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "sliding_window": 128,
        },
        128,
    ),
    # hybrid, window (2048) past max_model_len
    "gemma3_past": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "sliding_window": 2048,
            "sliding_window_pattern": 6,
        },
        1024,
    ),
    # mixture of experts under Mixtral's keys (num_local_experts, intermediate_size per expert)
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": None,
        },
        256,
    ),
    # gpt-oss in bf16 (no MXFP4 on the CPU): alternating 128-token window / full, attention sinks
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 128,
        },
        1024,
    ),
}

# a test's engines are built in turn after one import of vLLM (tests/vllm_engines.py); select a group
# with -k, e.g. -k windows
GROUPS: dict[str, tuple[str, ...]] = {
    "full": ("qwen3", "qwen2", "qwen3_moe", "deepseek_v2"),
    "windows": ("gemma3", "mistral", "mixtral", "gpt_oss"),
    # windows near a block / max_model_len; window = max_model_len = the CPU's block
    "edges": ("mistral_w129", "mistral_len", "mistral_blk", "gemma3_past", "mistral_w128_len128"),
}


def _batched(max_len: int) -> int:
    """The batched tokens a family is served with: for sliding-window families fewer than
    max_model_len (chunked prefill), so that the window, not the request length, bounds what a sliding
    layer holds."""
    return BATCHED if max_len > BATCHED * 4 else max(BATCHED, max_len)


def make_family_model(out: Path, family: str, tokenizer_dir: Path, seed: int = 1234) -> Path:
    """A random-weight bf16 model of ``family`` (transformers' classes) with the tiny tokenizer."""
    cfg_cls, model_cls, kwargs, _ = FAMILIES[family]
    return make_transformers_model(out, cfg_cls, model_cls, kwargs, tokenizer_dir, seed)


@pytest.mark.parametrize("pair", GROUPS.values(), ids=list(GROUPS))
def test_planned_kv_tokens_match_vllm_per_architecture(tmp_path: Path, pair: tuple[str, ...]) -> None:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    tok = make_tiny_model(tmp_path / "tok")
    rows: list[tuple[str, int, Any, int, int]] = []
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text()).flags
    cases = []
    for fam in pair:
        model_dir = make_family_model(tmp_path / fam, fam, tok)
        max_len = FAMILIES[fam][3]
        cases.append((fam, model_dir, kv_args(max_len, BUDGET, _batched(max_len))))
    settled = engine_kv(cases, tmp_path / "run")
    for fam, model_dir, _ in cases:
        max_len = FAMILIES[fam][3]
        batched = _batched(max_len)
        logged = settled[fam].kv_tokens
        facts = read_model_dir(model_dir)
        attn = cpu_attention(facts, flags)  # this CPU's backend and block, by vLLM's rule
        if facts.kv_lora_rank:  # the MLA backend vLLM chose is the one the rule names
            used = re.search(r"Using (\w+) backend", settled[fam].log)
            assert used and used.group(1) == attn.backend, (attn, used and used.group(0))
        # in flight: max_num_batched_tokens x 1 batch (no async scheduling on the CPU,
        # vllm/platforms/cpu.py:331)
        _, planned = vllm_kv_cache(
            facts, BUDGET, max_len, attn.block_size, facts.dtype_bytes, 1, in_flight=batched
        )
        rows.append((fam, max_len, attn, planned, logged))
        assert settled[fam].block_size == attn.block_size, (fam, attn, settled[fam].block_size)
        blocks = vllm_kv_cache(facts, BUDGET, max_len, attn.block_size, facts.dtype_bytes, 1, batched)[0]
        full = int(blocks / -(-max_len // attn.block_size) * max_len)  # the full-attention rule
        print(f"{fam}: vLLM {logged}, planned {planned}, full-attention rule {full}")
    bad = [r for r in rows if r[3] != r[4]]
    table = "\n".join(
        f"{f:12} max_len {n:5}  {a.backend} block {a.block_size:3}  planned {p:7}  vLLM {v:7}"
        for f, n, a, p, v in rows
    )
    print(table)
    assert not bad, table
