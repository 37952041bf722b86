"""Architecture families: weights (all experts), active parameters, KV bytes per token and vLLM's
KV capacity arithmetic, from the families' real config.json fields (catalog entries and tiny models
saved by transformers). Source references are to vLLM 0.32 (``.venv/.../site-packages/vllm``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hwprofile.model import from_catalog, parse_config, read_model_dir
from hwprofile.plan.memory import (
    CPU_BLOCK_TOKENS,
    active_weights_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_cache_groups,
    vllm_kv_cache,
    vllm_reported_kv_tokens,
)

GiB = 1 << 30


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # published sizes; "active" as the model cards count it (embeddings and LM head included,
        # except gpt-oss, whose card leaves out the input embedding: 3.6B / 5.1B)
        ("Qwen/Qwen3-30B-A3B", 30.5, 3.3),
        ("Qwen/Qwen3-235B-A22B", 235.0, 22.0),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 12.9),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", 15.7, 2.4 + 0.2),
        ("openai/gpt-oss-20b", 20.9, 3.6 + 0.58),
        ("openai/gpt-oss-120b", 116.8, 5.1 + 0.58),
        ("google/gemma-3-27b-it", 27.0, 27.0),  # text model only (the vision tower is ~0.4B)
        ("Qwen/Qwen3-8B", 8.2, 8.2),
    ],
)
def test_params_include_every_expert_and_active_only_the_routed(
    name: str, total_b: float, active_b: float
) -> None:
    m = from_catalog(name)
    assert m is not None
    assert m.params / 1e9 == pytest.approx(total_b, rel=0.03)
    assert (m.active_params or m.params) / 1e9 == pytest.approx(active_b, rel=0.05)


def test_moe_facts_read_from_each_family_keys() -> None:
    q = from_catalog("Qwen/Qwen3-30B-A3B")
    x = from_catalog("mistralai/Mixtral-8x7B-Instruct-v0.1")
    d = from_catalog("deepseek-ai/DeepSeek-V2-Lite-Chat")
    g = from_catalog("openai/gpt-oss-20b")
    assert q and x and d and g
    assert (q.num_experts, q.experts_per_token) == (128, 8)  # num_experts
    assert (x.num_experts, x.experts_per_token) == (8, 2)  # num_local_experts
    assert (d.num_experts, d.experts_per_token) == (64, 6)  # n_routed_experts (+2 shared)
    assert (g.num_experts, g.experts_per_token) == (32, 4)
    assert g.quant_method == "mxfp4" and g.quant_bits == 4
    # weights in memory: every expert (MXFP4 for gpt-oss: ~4 bits per weight, embeddings in 16)
    assert q.weights_bytes == q.params * 2
    assert 11 * GiB < g.weights_bytes < 14 * GiB
    # the decode ceiling reads the active share of the weights only
    assert active_weights_bytes(q) == int(q.weights_bytes * q.active_params / q.params)
    assert active_weights_bytes(from_catalog("Qwen/Qwen3-8B")) == from_catalog("Qwen/Qwen3-8B").weights_bytes


@pytest.mark.parametrize("name", ["openai/gpt-oss-20b", "openai/gpt-oss-120b"])
def test_a_token_of_mxfp4_experts_reads_every_16_bit_weight_and_its_experts_share(name: str) -> None:
    """gpt-oss keeps attention, embeddings and router in 16 bits and its routed experts in MXFP4: a token
    skips ``(experts - routed) / experts`` of the experts' own bytes, not that share of every byte (one
    share for all, ``active_params / params`` of the checkpoint, read gpt-oss-120b's token as 3.2 GB, not
    6.2). A checkpoint whose bytes follow its parameters (Qwen3-30B-A3B, bf16) keeps the one share."""
    m = from_catalog(name)
    assert m and m.mxfp4_expert_bytes and m.weights_bytes > m.mxfp4_expert_bytes
    e, k = m.num_experts, m.experts_per_token
    unrouted = m.mxfp4_expert_bytes * (e - k) // e
    assert active_weights_bytes(m) == m.weights_bytes - unrouted
    # every byte outside the routed experts is read: more than one share of every byte gives
    assert active_weights_bytes(m) > m.weights_bytes - m.mxfp4_expert_bytes
    assert active_weights_bytes(m) > 1.5 * m.weights_bytes * m.active_params / m.params
    # gpt-oss-20b: 24 layers of 32 experts, 4 routed; gpt-oss-120b: 36 layers of 128, 4 routed
    assert active_weights_bytes(m) == pytest.approx(
        {"openai/gpt-oss-20b": 4.88e9, "openai/gpt-oss-120b": 6.24e9}[name], rel=0.01
    )
    q = from_catalog("Qwen/Qwen3-30B-A3B")
    assert q and not q.mxfp4_expert_bytes
    assert active_weights_bytes(q) == int(q.weights_bytes * q.active_params / q.params)


def test_kv_bytes_per_token_per_family() -> None:
    q3 = from_catalog("Qwen/Qwen3-8B")  # explicit head_dim 128
    q2 = from_catalog("Qwen/Qwen2.5-7B-Instruct")  # GQA 28:4, head_dim = 3584 / 28
    moe = from_catalog("Qwen/Qwen3-30B-A3B")  # experts do not touch the KV cache
    assert q3 and q2 and moe
    assert kv_bytes_per_token(q3, 1, 2) == 2 * 36 * 8 * 128 * 2
    assert kv_bytes_per_token(q2, 1, 2) == 2 * 28 * 4 * 128 * 2
    assert kv_bytes_per_token(q2, 4, 2) == 2 * 28 * 1 * 128 * 2
    assert kv_bytes_per_token(moe, 1, 2) == 2 * 48 * 4 * 128 * 2


def test_mla_one_latent_per_layer_not_split_across_tp() -> None:
    """MLA (DeepSeek-V2): the cache holds one latent of kv_lora_rank + qk_rope_head_dim per token and
    layer (vllm/model_executor/layers/attention/mla_attention.py:479 ``head_size = kv_lora_rank +
    qk_rope_head_dim``), one "head", replicated on every TP rank (mla_attention.py:1356-1357
    ``num_kv_heads=1, max_tp_shards=1``). Checked against real vLLM in test_vllm_kv_arch.py."""
    d = from_catalog("deepseek-ai/DeepSeek-V2-Lite-Chat")
    assert d is not None
    assert (d.kv_lora_rank, d.qk_rope_head_dim) == (512, 64)
    per_token = 27 * (512 + 64) * 2
    for tp in (1, 2, 8):
        assert kv_bytes_per_token(d, tp, 2) == per_token
    assert per_token * 7 < 2 * 27 * 16 * 128 * 2  # 7x smaller than 2 x heads x head_dim
    assert kv_bytes_per_token(d, 1, 1) == 27 * 576  # fp8 KV cache


def test_gemma3_groups_and_capacity() -> None:
    """Gemma 3: 5 sliding-window layers per full one. vLLM groups layers by the smaller kind's
    count (v1/core/kv_cache_utils.py:1467-1478), pads the last group, takes a page per layer of a
    group per block (:1627), and logs int(num_blocks / blocks per request x max_model_len) (:1221,
    :2308); a sliding layer's request takes cdiv(min(window - 1 + in-flight, len), block) + 1 blocks
    (v1/kv_cache_interface.py:879-885)."""
    g = from_catalog("google/gemma-3-27b-it")
    assert g is not None
    assert (g.full_layers, g.sliding_layers, g.sliding_window) == (10, 52, 1024)
    assert kv_cache_groups(g) == [("full", 10)] + [("sliding", 10)] * 6
    page = 2 * 16 * 128 * 2 * 16  # K+V x KV heads x head_dim x bytes x 16-token block
    budget = 20 * GiB
    blocks, logged = vllm_kv_cache(g, budget, 32768, 16, 2, 1, in_flight=8192)
    assert blocks == budget // (10 * page)
    per_request = 2048 + 6 * (math.ceil((1023 + 8192) / 16) + 1)
    assert logged == int(blocks / per_request * 32768)
    # the 52 sliding layers hold ~9k tokens of a 32k request, not 32k: 40 % of full attention
    assert kv_bytes_per_sequence(g, 1, 2, 32768, 16, 8192) < kv_bytes_per_token(g, 1, 2) * 32768 * 0.41


def test_gpt_oss_alternating_window_with_sinks() -> None:
    """gpt-oss: even layers have the 128-token window (vllm/model_executor/models/gpt_oss.py:176),
    odd layers full attention; attention sinks are per-head weights (gpt_oss.py:130), not KV. 12 and
    12 layers make two groups of 12 (kv_cache_utils.py:1478). The KV layout is checked on real vLLM
    with a bf16 tiny gpt-oss (test_vllm_kv_arch.py); MXFP4 weights are not served by the CPU backend."""
    g = from_catalog("openai/gpt-oss-20b")
    assert g is not None
    assert (g.full_layers, g.sliding_layers, g.sliding_window) == (12, 12, 128)
    assert kv_cache_groups(g) == [("full", 12), ("sliding", 12)]
    page = 2 * 8 * 64 * 2 * 16
    blocks, logged = vllm_kv_cache(g, 10 * GiB, 131072, 16, 2, 1, in_flight=8192)
    assert blocks == 10 * GiB // (12 * page)
    assert logged == int(blocks / (8192 + math.ceil((127 + 8192) / 16) + 1) * 131072)


def test_uniform_sliding_window_mistral_v01() -> None:
    """Mistral 7B v0.1 (sliding_window 4096 on every layer): one group of sliding layers
    (model-level window, vllm/model_executor/layers/attention/attention.py:269-271)."""
    m = parse_config(
        {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
            "sliding_window": 4096,
        },
        "m",
        "dir",
        None,
    )
    assert kv_cache_groups(m) == [("sliding", 32)]
    blocks, logged = vllm_kv_cache(m, 8 * GiB, 32768, 16, 2, 1, in_flight=2048)
    assert blocks == 8 * GiB // (32 * 2 * 8 * 128 * 2 * 16)
    assert logged == int(blocks / (math.ceil((4095 + 2048) / 16) + 1) * 32768)
    v3 = from_catalog("mistralai/Mistral-7B-Instruct-v0.3")  # no window: full attention
    assert v3 is not None and kv_cache_groups(v3) == [("full", 32)]


def test_uniform_models_agree_with_the_old_reporting_rule() -> None:
    q = from_catalog("Qwen/Qwen3-8B")
    assert q is not None
    per_token = kv_bytes_per_token(q, 1, 2)
    for budget, max_len in ((GiB, 4096), (3 * GiB + 12345, 1000), (64 << 20, 128)):
        blocks, logged = vllm_kv_cache(q, budget, max_len, CPU_BLOCK_TOKENS)
        assert blocks == budget // (per_token * CPU_BLOCK_TOKENS)
        assert logged == vllm_reported_kv_tokens(blocks * CPU_BLOCK_TOKENS, max_len, CPU_BLOCK_TOKENS)


def test_moe_decode_ceiling_uses_active_parameters(host_of, empty_root) -> None:
    from hwprofile.pipeline import make_plan

    p = make_plan(host_of("a800-pcie-4x-2numa"), empty_root, environ={}, model="Qwen/Qwen3-30B-A3B")
    m = from_catalog("Qwen/Qwen3-30B-A3B")
    assert m is not None
    inst = p.instances[0]
    est = inst.estimate
    tp = inst.tensor_parallel_size
    assert est.bytes_read_per_token_per_gpu == int(active_weights_bytes(m) / tp)
    assert est.bytes_read_per_token_per_gpu < m.weights_bytes / tp / 5


def test_tiny_models_params_equal_the_saved_tensors(tmp_path: Path) -> None:
    """The parameter count read from config.json equals the element count of the weights
    transformers saves, for every family of test_vllm_kv_arch.py (all experts, MLA projections,
    q/k norms, biases)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_vllm_kv_arch import FAMILIES, make_family_model

    for fam in FAMILIES:
        d = make_family_model(tmp_path / fam, fam, tmp_path)
        with safetensors.safe_open(str(d / "model.safetensors"), "pt") as f:
            n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
        facts = read_model_dir(d)
        assert facts.params == n, fam
        assert facts.active_params <= facts.params


def test_startup_check_expects_vllms_own_figure_for_sliding_window_models(host_of, empty_root) -> None:
    """A CPU plan of Gemma 3 (5 sliding : 1 full) carries what vLLM will log; the startup check
    compares with that, not with the all-layers-full formula (which would warn falsely)."""
    from hwprofile.pipeline import make_plan
    from hwprofile.plan.memory import vllm_reported_kv_tokens
    from hwprofile.supervise.verify import compare

    plan = make_plan(
        host_of("no-driver"),
        empty_root,
        model="google/gemma-3-1b-it",
        sets=["speculative.method=none"],
        environ={},
    )
    inst = plan.instances[0]
    mem = inst.memory
    naive = vllm_reported_kv_tokens(mem.kv_tokens, inst.engine.max_model_len, mem.block_size)
    assert mem.vllm_logged_kv_tokens != naive  # vLLM groups sliding and full layers (kv_cache_utils)
    assert not [w for w in compare(inst, {"kv_cache_tokens": mem.vllm_logged_kv_tokens}) if "KV cache" in w]
    assert [w for w in compare(inst, {"kv_cache_tokens": naive}) if "KV cache" in w]


# the tiny DeepSeek-V2 (MLA) of tests/test_vllm_kv_arch.py: 2 layers, one 512 + 64 latent per token
TINY_MLA = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
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
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
AVX512_NO_AMX = ("fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni")
SAPPHIRE_RAPIDS = (*AVX512_NO_AMX, "amx_bf16", "amx_tile", "amx_int8")


def test_cpu_attention_follows_vllms_isa_rule() -> None:
    """vLLM 0.32 ``CpuPlatform``: MLA takes the AMX kernel (128-token blocks) where the CPU has AMX
    tiles, else the reference CPU_MLA kernel (16-token blocks, chunked prefill off); other models
    CPU_ATTN with 128; DeepSeek-V4 256."""
    from hwprofile.plan.cpu import cpu_attention

    mla = parse_config(TINY_MLA, "mla", "dir", None)
    dense = from_catalog("Qwen/Qwen3-8B")
    assert dense is not None
    assert cpu_attention(mla, SAPPHIRE_RAPIDS)[:3] == ("AMX_MLA", 128, True)
    assert cpu_attention(mla, AVX512_NO_AMX)[:3] == ("CPU_MLA", 16, False)
    assert cpu_attention(mla, ("fp", "asimd", "sve"))[:3] == ("CPU_MLA", 16, False)  # Arm: no AMX
    assert "no CPU flags" in cpu_attention(mla, ()).reason
    for flags in (SAPPHIRE_RAPIDS, AVX512_NO_AMX, ()):
        assert cpu_attention(dense, flags)[:3] == ("CPU_ATTN", 128, True)
    v4 = parse_config({**TINY_MLA, "model_type": "deepseek_v4"}, "v4", "dir", None)
    assert cpu_attention(v4, SAPPHIRE_RAPIDS).block_size == 256


def test_mla_logged_kv_on_cpus_with_and_without_amx() -> None:
    """What real vLLM 0.32 logged for the tiny MLA model at 64 MiB, max_model_len 256: 29,056 tokens
    on an AMX CPU (stop 15), 29,120 on an AVX-512 CPU without AMX (this machine, CI's kind): the
    same arithmetic with the block each CPU gets."""
    from hwprofile.plan.cpu import cpu_attention

    mla = parse_config(TINY_MLA, "mla", "dir", None)
    logged = {
        name: vllm_kv_cache(mla, 64 * 2**20, 256, cpu_attention(mla, flags).block_size, 2, 1, 128)[1]
        for name, flags in (("amx", SAPPHIRE_RAPIDS), ("avx512", AVX512_NO_AMX))
    }
    assert logged == {"amx": 29056, "avx512": 29120}


def test_cpu_plan_of_an_mla_model_uses_the_cpus_block(host_of, empty_root, tmp_path) -> None:
    import json

    from hwprofile.pipeline import make_plan

    model = tmp_path / "mla"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_MLA))
    host = host_of("no-driver")
    got = {}
    for name, flags in (("amx", SAPPHIRE_RAPIDS), ("avx512", AVX512_NO_AMX)):
        h = host._replace(cpu=host.cpu._replace(flags=flags))
        p = make_plan(h, empty_root, environ={}, model=str(model), sets=["speculative.method=none"]).to_json()
        (inst,) = p["instances"]
        why = {r["key"]: r["reason"] for r in p["reasons"]}
        got[name] = (
            inst["memory"]["block_size"],
            inst["engine"]["enable_chunked_prefill"],
            inst["engine"]["enable_prefix_caching"],
            inst["engine"]["max_num_batched_tokens"] >= 2048,
        )
        assert ("AMX" if name == "amx" else "CPU_MLA") in why["instances[0].memory.block_size"]
    assert got["amx"][0] == 128 and got["avx512"] == (16, False, False, True)


def test_the_memory_profile_holds_the_sampler_warm_up_over_every_sequences_logits() -> None:
    """vLLM's profiling run ends with a sampler warm-up on ``max_num_seqs`` rows of logits, top-k and top-p
    on, after its forward pass: the peak is the larger of the two, the warm-up's beside the hidden states
    the run keeps. FlashInfer's path holds the bf16 logits, their fp32 copy, the masked fp32 logits and
    the fp32 probabilities at once (2 + 4 + 4 + 4 bytes an element): at 1,024 sequences over gpt-oss's
    201,088-token vocabulary 2.9 GB against the KV cache, where one fp32 copy (0.8 GB) was counted.
    PyTorch's sort holds 38 bytes an element: vLLM logs 7.38 GiB for gpt-oss-20b on an H100 at 8,192
    tokens and 1,024 sequences, 4.76 for Llama-3.1-8B and 5.56 for Qwen3-0.6B (llm-d-benchmark)."""
    from hwprofile.plan.memory import GiB, activation_bytes

    g = from_catalog("openai/gpt-oss-120b")
    assert g and g.vocab_size == 201088
    kept = 8192 * g.hidden_size * 2
    assert activation_bytes(g, 1, 8192, 1024, 1.0) == 1024 * g.vocab_size * (2 + 4 + 4 + 4) + kept
    assert 2.8e9 < activation_bytes(g, 1, 8192, 1024, 1.0) - kept < 3.0e9
    # the forward pass alone where no sequence samples; the two moments never add up
    forward = activation_bytes(g, 1, 8192, 0, 1.0)
    assert forward == 8192 * (4 * g.hidden_size + 2 * g.intermediate_size) * 2
    assert activation_bytes(g, 1, 8192, 1024, 1.0) < forward + 1024 * g.vocab_size * 14 + kept

    # PyTorch's sort: 38 bytes an element at one row or 128 and more, 50 between (a full sort, twice)
    def torch_rows(n: int) -> int:  # n sequences of one token each
        return activation_bytes(g, 1, n, n, 1.0, "torch") - n * g.hidden_size * 2

    assert [torch_rows(n) // (n * g.vocab_size) for n in (1, 2, 127, 128, 1024)] == [38, 50, 50, 38, 38]
    # at most one row per token the step holds; the factor scales the whole peak
    assert activation_bytes(g, 1, 512, 1024, 1.0) == 512 * 201088 * 14 + 512 * g.hidden_size * 2
    assert activation_bytes(g, 1, 8192, 1024, 2.0) == 2 * activation_bytes(g, 1, 8192, 1024, 1.0)
    # vLLM's logged peaks (llm-d-benchmark, an H100, 8,192 tokens, 1,024 sequences, PyTorch's sort)
    for name, logged in (("openai/gpt-oss-20b", 7.38), ("meta-llama/Llama-3.1-8B-Instruct", 4.76)):
        m = from_catalog(name)
        assert m is not None
        assert abs(activation_bytes(m, 1, 8192, 1024, 1.0, "torch") / GiB - logged) < 0.1


def test_the_kv_pool_keeps_sliding_window_layers_in_groups_of_their_own() -> None:
    """vLLM's allocator cuts gpt-oss's 18 full and 18 sliding layers into two groups of 18 sharing one
    pool (kv_cache_utils ``_get_kv_cache_groups_uniform_page_size``): a pool block is 18 layers' pages,
    so the pool holds twice the blocks of every layer's count, and a long request holds its tokens' in
    the full group and its window's in the sliding one. The plan's simulation and its requests-in-cache
    take that pool; a model of full attention alone keeps one group of every layer."""
    from hwprofile.plan.candidates import model_shape
    from hwprofile.plan.memory import kv_pool

    g = from_catalog("openai/gpt-oss-120b")
    assert g is not None
    pool = kv_pool(g, 2)
    assert pool is not None and pool.windows == (0, 128) and pool.scale == 2.0
    shape = model_shape(g, 2)
    assert shape.kv_pool(56_336) == (112_672, (0, 128))
    # 32,100-token requests: 2,007 full blocks + the window's 8 each, three in 7,042 blocks (one by
    # every layer's count)
    assert shape.requests_in_kv(56_336, 32_100) == 3
    plain = from_catalog("Qwen/Qwen3-32B")
    assert plain is not None and kv_pool(plain, 2) is None
    assert model_shape(plain, 2).kv_pool(56_336) == (56_336, (0,))


def test_cuda_graph_memory_comes_off_the_kv_cache_from_vllm_0_20() -> None:
    """vLLM 0.20 estimates the CUDA graphs' memory in its profile and takes it from the KV cache
    (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default 1); 0.18 and 0.19 only with the variable set,
    and before they capture the graphs after sizing the cache, in what gpu_memory_utilization leaves."""
    from hwprofile.config.settings import Settings
    from hwprofile.plan.engine import fit_args

    s = Settings.from_tree({})[0]
    graphs = s.memory.cuda_graph_bytes
    assert graphs > 0
    assert fit_args(s, False, "0.19.0")["graph_bytes"] == 0
    assert fit_args(s, False, "0.11.0")["graph_bytes"] == 0
    assert fit_args(s, False, "0.20.0")["graph_bytes"] == graphs
    assert fit_args(s, False, None)["graph_bytes"] == graphs  # unknown release: the newest behaviour
    assert fit_args(s, True, "0.32.0")["graph_bytes"] == 0  # eager: no graphs


def test_chunked_local_attention_and_drafts_keep_every_layers_count() -> None:
    """Chunked-local layers (Llama 4) are kept apart by vLLM only where
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE allows, and free back to the chunk's start, not a
    window; a draft model's layers join the target's groups: neither is modelled, so the pool is every
    layer's count, as vLLM's single group keeps it."""
    from hwprofile.plan.candidates import model_shape

    g = from_catalog("openai/gpt-oss-120b")
    assert g is not None
    shape = model_shape(g, 2)
    assert shape.kv_pool(56_336, drafted=True) == (56_336, (0,))
    assert shape.requests_in_kv(56_336, 32_100, drafted=True) == 1
    from hwprofile.model.hfconfig import parse_config
    from hwprofile.plan.memory import kv_cache_groups, kv_pool

    # a tiny Llama 4: three chunked-local layers (4,096-token chunks) to one full one
    text = dict(model_type="llama4_text", num_hidden_layers=4, attention_chunk_size=4096, vocab_size=1000)
    text |= dict(no_rope_layers=[1, 1, 1, 0], interleave_moe_layer_step=1, num_local_experts=4)
    text |= dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=64)
    text |= dict(intermediate_size=512, intermediate_size_mlp=1024)
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text}
    llama4 = parse_config(cfg, "l4", "test", None)
    assert {k for k, _ in kv_cache_groups(llama4)} == {"chunked", "full"}
    assert kv_pool(llama4, 2) is None


def test_the_sampler_warm_up_is_pytorchs_sort_where_flashinfer_is_not_installed() -> None:
    """Before vLLM 0.12 FlashInfer is an extra: ``pip install vllm`` leaves it out, and the sampler's
    top-k/top-p then sorts: 38 bytes an element at its peak (50 at 2 to 127 rows), not FlashInfer's 14.
    From 0.12 to 0.20 FlashInfer's sampler is opt-in (VLLM_USE_FLASHINFER_SAMPLER=1), on by default again
    from 0.21. Two H100 logs of gpt-oss-120b on Marlin, both installs without FlashInfer at 1,024
    sequences: 0.10.1 at 0.9 and 8,192 batched tokens, "Available KV cache memory: -2.14 GiB"
    (vllm-project/vllm#23278); 0.11 at 0.95 and 1,024 batched tokens, 1.71 GiB (#27508). The plan is
    within 0.5 GiB of both, on the safe side (its own margin): -2.34 and 1.66; with FlashInfer counted it
    would leave 2.26 and 6.26 GiB. A snapshot that does not list its
    kernel packages is taken to have FlashInfer (vLLM's images do), and a reason says so."""
    from hwprofile.config.settings import Settings
    from hwprofile.model.resolve import resolve_model
    from hwprofile.plan.engine import fit_args, sampler
    from hwprofile.plan.loaded import expert_tile
    from hwprofile.plan.memory import GiB, MiB, fit
    from hwprofile.plan.reasons import Reasons

    assert sampler("0.11.0", ())[0] == "torch" and "not installed" in sampler("0.11.0", ())[1]
    assert sampler("0.11.0", ("flashinfer-python 0.3.1",))[0] == "flashinfer"
    assert sampler("0.11.0", None)[0] == "flashinfer" and "assumed" in sampler("0.11.0", None)[1]
    # 0.12 to 0.20: FlashInfer installed, its sampler opt-in: PyTorch's sort, then (0.18) a Triton kernel
    # whose buffers are not read; from 0.21 FlashInfer's on by default again
    assert (
        sampler("0.12.0", ("flashinfer-python 0.5.3",))[0] == "torch"
        and "opt-in" in sampler("0.16.0", None)[1]
    )
    assert sampler("0.18.0", None)[0] == "flashinfer" and "not read" in sampler("0.20.0", None)[1]
    assert sampler("0.21.0", ())[0] == sampler("0.33.0", None)[0] == sampler(None, None)[0] == "flashinfer"
    s = Settings.from_tree({})[0]
    h100 = 85_520_809_984 - 479 * MiB  # 79.18 GiB as CUDA counts it (NVML: 79.65, less the driver's)

    def kv(release: str, share: float, tokens: int, packages: tuple[str, ...] | None) -> float:
        oss = expert_tile(resolve_model("openai/gpt-oss-120b", "model"), "9.0", Reasons({}), release)
        f = fit(h100, share, oss, None, 1, 2, tokens, 1024, **fit_args(s, False, release, packages))
        return f.kv_cache_bytes / GiB

    with_fi = ("flashinfer-python 0.2.9",)
    assert kv("0.10.1", 0.9, 8192, ()) < 0 < kv("0.10.1", 0.9, 8192, with_fi)
    for release, share, tokens, logged in (("0.10.1", 0.9, 8192, -2.14), ("0.11.0", 0.95, 1024, 1.71)):
        assert logged - 0.5 < kv(release, share, tokens, ()) < logged
        assert kv(release, share, tokens, with_fi) > logged + 0.1
