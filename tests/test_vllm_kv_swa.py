"""Sliding-window KV capacity as vLLM 0.32 accounts for it (fast, pure).

vLLM reserves for each request, in each sliding-window layer, its admission cap
(``SlidingWindowSpec.max_admission_blocks_per_request``, 0.32.0 vllm/v1/kv_cache_interface.py)::

    cdiv(min(sliding_window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1

and logs ``KV cache size: int(num_blocks / blocks per request × max_model_len) tokens``
(``get_kv_cache_capacity``, v1/core/kv_cache_utils.py). ``max_in_flight_tokens`` is one
``max_num_batched_tokens`` batch up to 0.25 and ``max_concurrent_batches`` of them from 0.29 (two
with async scheduling, GPUs' default). The cases: a window near the block size, near
``max_model_len``, past it, and ``max_model_len`` equal to the block size, where vLLM logs half what
the full-attention formula says. The real-vLLM comparison is tests/test_vllm_kv_arch.py (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwprofile.model import ModelFacts, parse_config
from hwprofile.plan.memory import (
    in_flight_tokens,
    kv_bytes_per_sequence,
    kv_bytes_per_token_layer,
    sliding_window_blocks,
    vllm_kv_cache,
    vllm_reported_kv_tokens,
)
from hwprofile.supervise.verify import compare

MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "sliding_window": 4096,
}


def mistral(window: int) -> ModelFacts:
    return parse_config({**MISTRAL, "sliding_window": window}, "m", "dir", None)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize(
    ("window", "length", "block", "in_flight", "blocks"),
    [
        (16, 4096, 16, 0, cdiv(15, 16) + 1),  # window = block: one block plus the unaligned one
        (17, 4096, 16, 0, cdiv(16, 16) + 1),  # window - 1 = block
        (18, 4096, 16, 0, cdiv(17, 16) + 1),  # one token past: three blocks
        (129, 1024, 128, 128, cdiv(256, 128) + 1),  # the CPU's 128-token block, one batch in flight
        (4096, 4096, 16, 2048, cdiv(4096, 16) + 1),  # window = max_model_len: the request's blocks + 1
        (4000, 4096, 16, 0, cdiv(3999, 16) + 1),  # window just under max_model_len
        (8192, 4096, 16, 0, cdiv(4096, 16) + 1),  # window past max_model_len: capped by the length
        (4096, 16, 16, 8192, 2),  # max_model_len = block: 2 blocks where full attention takes 1
    ],
)
def test_admission_cap(window: int, length: int, block: int, in_flight: int, blocks: int) -> None:
    m = mistral(window)
    assert sliding_window_blocks(m, length, block, in_flight) == blocks
    page = kv_bytes_per_token_layer(m, 1, 2) * block
    # what vLLM reserves for one max-length request (max_memory_usage_bytes): every layer's cap
    assert kv_bytes_per_sequence(m, 1, 2, length, block, in_flight, reserve=True) == 32 * blocks * page
    # at run time a request holds at most its own blocks (get_num_blocks_to_allocate's clamp)
    held = min(blocks, cdiv(length, block))
    assert kv_bytes_per_sequence(m, 1, 2, length, block, in_flight) == 32 * held * page


def test_logged_capacity_is_half_the_full_attention_figure_at_one_block() -> None:
    m = mistral(4096)
    page = kv_bytes_per_token_layer(m, 1, 2) * 16
    kv = 1000 * 32 * page  # 1000 blocks in every layer
    num_blocks, logged = vllm_kv_cache(m, kv, 16, 16, 2, 1, in_flight=8192)
    assert num_blocks == 1000 and logged == 1000 // 2 * 16  # 2 blocks per request
    assert vllm_reported_kv_tokens(1000 * 16, 16, 16) == 2 * logged  # what was planned before
    _, logged = vllm_kv_cache(m, kv, 4096, 16, 2, 1, in_flight=2 * 2048)
    assert logged == int(1000 / 257 * 4096)  # window = max_model_len: 257 blocks, not 256


def test_window_128_at_max_model_len_128_on_the_cpu_logs_65536_of_131072() -> None:
    """Issue 32's case: every layer a 128-token window, ``max_model_len`` 128, the CPU's 128-token block,
    one batch of 128 in flight. ``min(127 + 128, 128) = 128`` tokens, ``cdiv(128, 128) + 1 = 2`` blocks
    per request, so the 1,024 blocks of the cache hold 512 requests: vLLM 0.32 logs 65,536 tokens where
    the full-attention rule (1 block per request) said 131,072 (the real-vLLM run:
    tests/test_vllm_kv_arch.py, mistral_w128_len128)."""
    m = mistral(128)
    assert sliding_window_blocks(m, 128, 128, 128) == 2
    kv = 1024 * 32 * kv_bytes_per_token_layer(m, 1, 2) * 128  # 1,024 blocks in every layer
    assert vllm_kv_cache(m, kv, 128, 128, 2, 1, in_flight=128) == (1024, 65536)
    assert vllm_reported_kv_tokens(1024 * 128, 128, 128) == 131072
    # at max_model_len 256 the window and the batch in flight, 255 tokens, take three blocks
    assert vllm_kv_cache(m, kv, 256, 128, 2, 1, in_flight=128) == (1024, int(1024 / 3 * 256))


def test_in_flight_tokens_by_release_and_device() -> None:
    assert in_flight_tokens("0.25.0", 2048) == 2048  # one batch up to 0.25
    assert in_flight_tokens("0.22.0", 2048, "cuda", 2) == 2048
    assert in_flight_tokens("0.32.0", 2048) == 4096  # async scheduling: two batches
    assert in_flight_tokens("0.32.0+cpu", 2048, "cpu") == 2048  # no async scheduling on the CPU
    assert in_flight_tokens("0.32.0", 2048, "cuda", 1, "ngram") == 2048  # ngram turns it off
    assert in_flight_tokens("0.33.0", 2048, "cuda", 1, "ngram") == 4096  # not on 0.33's Model Runner V2
    assert in_flight_tokens("0.33.0", 2048, "cuda", 1, "suffix") == 2048  # V1 runner: still off
    assert in_flight_tokens("0.33.0", 2048, "cuda", 2) == 3 * 2048  # PP + 1
    assert in_flight_tokens(None, 1024) == 2048  # unknown: the newest rule


def test_gpu_plan_of_a_sliding_window_model_carries_vllms_figure(host_of, empty_root, tmp_path: Path) -> None:
    from hwprofile.pipeline import make_plan

    d = tmp_path / "mistral"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                **MISTRAL,
                "num_hidden_layers": 8,
                "hidden_size": 1024,
                "intermediate_size": 2048,
                "sliding_window": 1024,
            }
        )
    )
    host = host_of("rtx4090-1x")
    host = host._replace(software=host.software._replace(vllm_version="0.32.0"))
    plan = make_plan(
        host,
        empty_root,
        environ={},
        model=str(d),
        sets=["speculative.method=none", "engine.max_model_len=1024"],
    )
    inst = plan.instances[0]
    mem, eng = inst.memory, inst.engine
    facts = parse_config(json.loads((d / "config.json").read_text()), "mistral", "dir", str(d))
    flight = 2 * int(eng.max_num_batched_tokens)  # async scheduling on a GPU, vLLM 0.32
    kvb = mem.kv_bytes_per_token_target // (8 * kv_bytes_per_token_layer(facts, 1, 1))  # fp8 on a 4090
    want = vllm_kv_cache(facts, mem.kv_cache_bytes, int(eng.max_model_len), 16, kvb, 1, flight)[1]
    assert mem.vllm_logged_kv_tokens == want
    # window (1024) >= max_model_len: 64 + 1 blocks per request, so vLLM logs 64/65 of the blocks
    before = vllm_reported_kv_tokens(mem.kv_tokens, 1024)
    assert want == int(mem.kv_tokens // 16 / 65 * 1024) and before > want
    started = {"kv_cache_tokens": want}
    assert not [w for w in compare(inst, started) if w.startswith("KV cache")]
    assert mem.kv_bytes_per_max_len_request == 8 * 65 * kv_bytes_per_token_layer(facts, 1, kvb) * 16
    print(f"mistral-like window 1024, max_model_len 1024: planned before {before}, now {want} (vLLM's rule)")


def test_context_is_shortened_to_what_vllms_start_up_check_accepts() -> None:
    """vLLM refuses to start unless the cache holds one max_model_len request as it reserves it
    (``check_enough_kv_cache_memory``): a cache that holds the window at run time but not window +
    in-flight gets a shorter max_model_len, not a failed start."""
    from hwprofile.config.settings import Settings
    from hwprofile.plan.engine import context_length
    from hwprofile.plan.memory import Fit, kv_bytes_per_token
    from hwprofile.plan.reasons import Reasons

    m = mistral(4096)
    per_token = kv_bytes_per_token(m, 1, 2)
    kv = 6000 * per_token  # 6,000 tokens in every layer
    f = Fit(1 << 40, 0, 0, 0, 0, kv, per_token, kv // per_token)
    settings = Settings()
    assert settings.engine.max_model_len == 8192
    usable = kv - per_token * 16  # the null block
    assert kv_bytes_per_sequence(m, 1, 2, 8192) <= usable  # at run time: 4095 window tokens + a block
    flight = 2 * 8192  # two batches of 8192 in flight (vLLM 0.32 on a GPU)
    assert kv_bytes_per_sequence(m, 1, 2, 8192, 16, flight, reserve=True) > usable  # vLLM: 513 blocks
    planned = context_length(m, None, 1, 2, f, settings, Reasons({}), "i", flight)
    assert planned == 5888  # 369 blocks of 16 per layer fit the 374 usable; 6144 (385) would not
    assert context_length(m, None, 1, 2, f, settings, Reasons({}), "i") == 8192  # the old count
