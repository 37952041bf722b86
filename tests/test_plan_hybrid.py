"""Plans of a hybrid model (recurrent-state layers beside attention): the seeds' Qwen3.8-27B from
its config-only copy (tests/fixtures/models/qwen3.8-27b) on an A100 80G, and a tiny Qwen3-Next on
the CPU. KV per token counts the attention layers only, the state per sequence is in the memory
breakdown and its reasons, ``max_num_seqs`` never exceeds the sequences whose state the pool holds,
the logged KV figure is vLLM's hybrid arithmetic, and releases before the architecture are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hwprofile.plan import PlanRefused
from hwprofile.plan.memory import hybrid_kv_cache

QWEN38 = Path(__file__).parent / "fixtures" / "models" / "qwen3.8-27b"
TINY_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 128,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 256, "vocab_size": 2048, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip


def qwen38_dir(tmp_path: Path) -> Path:
    d = tmp_path / "Qwen3.8-27B"
    shutil.copytree(QWEN38, d)
    return d


def test_qwen38_on_an_a100_counts_attention_layers_and_caps_sequences(host_of, empty_root, tmp_path) -> None:
    from hwprofile.pipeline import make_plan

    sets = ["speculative.method=none", "engine.max_num_seqs=1024", "engine.max_model_len=32768"]
    p = make_plan(
        host_of("a100-80g-pcie-1x"), empty_root, environ={}, model=str(qwen38_dir(tmp_path)), sets=sets
    )
    inst = p.instances[0]
    mem = inst.memory
    assert mem.kv_bytes_per_token_target == 65_536  # 16 full-attention layers, bf16
    assert mem.block_size == 784  # aligned to the fp32 GDN state page
    # 48 GDN layers x 3,211,264 B padded pages, 1 slot each (prefix caching off by default?)
    slots = 2 if inst.engine.enable_prefix_caching else 1
    assert mem.state_bytes_per_sequence == 48 * 3_211_264 * slots
    assert inst.engine.max_num_seqs <= mem.state_sequences < 1024
    why = {r.key: r.reason for r in p.reasons}
    assert "state" in why["instances[0].engine.max_num_seqs"]
    assert "MiB per GPU" in why["instances[0].memory.state_bytes_per_sequence"]
    assert any("max_num_seqs 1024 lowered" in w for w in p.warnings)
    from hwprofile.views import format_plan

    text = format_plan(p, explain=True)
    print(text)
    assert "recurrent state" in text and "per running sequence" in text
    from hwprofile.model import read_model_dir

    m = read_model_dir(qwen38_dir(tmp_path / "again"))
    h = hybrid_kv_cache(m, mem.kv_cache_bytes, inst.engine.max_model_len, prefix_caching=slots == 2)
    assert mem.vllm_logged_kv_tokens == h.logged_tokens


@pytest.mark.parametrize("version", ["0.16.0", "0.12.1"])
def test_releases_before_qwen3_5_are_refused_naming_the_first(host_of, empty_root, tmp_path, version) -> None:
    from hwprofile.pipeline import make_plan

    host = host_of("a100-80g-pcie-1x")
    host = host._replace(software=host.software._replace(vllm_version=version))
    with pytest.raises(PlanRefused, match=r"0\.17\.0"):
        make_plan(
            host, empty_root, environ={}, model=str(qwen38_dir(tmp_path)), sets=["speculative.method=none"]
        )


def test_tiny_qwen3_next_cpu_plan_says_what_vllm_logs(host_of, empty_root, tmp_path) -> None:
    """On an AVX512-BF16 CPU vLLM keeps the state in float32 (block 256 for this model), elsewhere
    in the model's bfloat16 (block 128): the plan's figure follows (the slow test checks vLLM)."""
    from hwprofile.pipeline import make_plan

    model = tmp_path / "next"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_NEXT))
    host = host_of("no-driver")
    got = {}
    for name, flags in (("bf16", ("fpu", "avx2", "avx512f", "avx512_bf16")), ("plain", ("fpu", "avx2"))):
        h = host._replace(cpu=host.cpu._replace(flags=flags))
        sets = ["speculative.method=none", "engine.max_model_len=1024", "cpu.kv_cache_space_gib=0.0625",
                "engine.enable_prefix_caching=false"]  # fmt: skip
        p = make_plan(h, empty_root, environ={}, model=str(model), sets=sets)
        mem = p.instances[0].memory
        got[name] = (mem.block_size, mem.vllm_logged_kv_tokens, mem.kv_bytes_per_token_target)
    assert got["bf16"] == (256, 37_449, 2 * 2 * 2 * 64 * 2)
    assert got["plain"] == (128, 47_662, 2 * 2 * 2 * 64 * 2)
