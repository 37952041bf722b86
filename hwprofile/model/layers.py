"""The layer stack of a decoder, read layer by layer from its config.json: each layer's token
mixer (full, sliding-window, chunked-local or MLA attention; a recurrent state: Gated DeltaNet,
Mamba, Mamba2, KDA, linear attention; or none) and its MLP (dense, mixture of experts, none), the
attention shape of each attention kind (head size and KV heads: a model's global layers may be
wider than its sliding ones) and the dimensions of the recurrent state that vLLM's
``MambaStateShapeCalculator`` (``model_executor/layers/mamba/mamba_utils.py``) sizes.

Schemas read, as the families write them:

- ``layer_types`` (Qwen3-Next/Qwen3.5 ``linear_attention``/``full_attention``; Gemma 2/3/4, gpt-oss
  ``sliding_attention``; Llama-4 style ``chunked_attention``; Granite-4 ``mamba``/``attention``;
  LFM2 ``conv``/``full_attention``: a gated short convolution whose state is its last inputs);
- ``full_attention_interval`` (Qwen3-Next, Qwen3.5 without ``layer_types``: layer ``i`` is full
  attention when ``(i + 1) % interval == 0``);
- Nemotron-H ``hybrid_override_pattern`` (one character a layer: ``M`` Mamba2, ``*`` attention,
  ``-`` MLP, ``E`` mixture of experts);
- Kimi-Linear ``linear_attn_config`` (``kda_layers``/``full_attn_layers``, 1-based; the full layers
  are MLA);
- MiniMax-Text-01 ``attn_type_list`` (0: lightning linear attention, 1: softmax attention);
- Bailing MoE V2.5 ``layer_group_size`` (lightning linear attention, an MLA layer closing each group);
- Jamba ``attn_layer_period``/``attn_layer_offset`` (Mamba1 elsewhere) and
  ``expert_layer_period``/``expert_layer_offset``;
- Bamba ``attn_layer_indices`` (Mamba2 elsewhere);
- MiMo-V2 ``hybrid_layer_pattern`` (1: sliding window, 0: full), its sliding layers with heads of
  their own (``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``) and V head sizes
  apart from K's (``v_head_dim``);
- Llama-4 ``attention_chunk_size`` with ``no_rope_layers`` (0: a global NoPE layer, else chunked
  local attention) and ``interleave_moe_layer_step``;
- Gemma 2 (alternating), Gemma 3 ``sliding_window_pattern``, a model-wide ``sliding_window``
  (Mistral): the rules hwprofile applied before (``hfconfig._sliding_layers``).

Falcon-H1 (``falcon_h1``): every layer runs attention and a Mamba2 mixer side by side; vLLM registers
the mixer as a state layer of its own (``falcon_h1.py`` ``FalconH1ParallelHybrid``: layer ``N + i``),
so the stack is ``N`` full-attention layers with ``parallel_state`` set. Zamba2 (``zamba2``): every
layer runs a Mamba2 mixer; its ``hybrid`` layers (``layers_block_type``, else ``hybrid_layer_ids``)
also run one of ``num_mem_blocks`` shared attention + MLP blocks, each call with a KV cache of its
own (``zamba2.py``): ``hybrid`` layers are full attention with ``parallel_state`` set, the others
Mamba2 layers without an MLP. Zamba (the first, no vLLM support) is refused by name.

Pure: a dict in, tuples out.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

MIXERS = (
    "full",
    "sliding",
    "chunked",
    "mla",
    "gdn",
    "mamba",
    "mamba2",
    "kda",
    "linear",
    "short_conv",
    "none",
)
ATTENTION_MIXERS = ("full", "sliding", "chunked", "mla")
STATE_MIXERS = ("gdn", "mamba", "mamba2", "kda", "linear", "short_conv")
MLPS = ("dense", "moe", "none")
BAILING_LINEAR = ("BailingMoeV2_5ForCausalLM",)  # architectures whose layer_group_size cuts linear/MLA
# ... and whose linear layers are KDA, every layer past the last whole group MLA (bailing_moe_v3.py)
BAILING_KDA = ("BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration")
# architectures whose layer_types' linear_attention layers are Kimi Delta Attention (not GDN)
KDA_LINEAR = (*BAILING_KDA, "AliceAIForCausalLM", "Glm5NextForCausalLM", "Glm5NextForConditionalGeneration")
# model types whose vLLM config class takes the config's mamba_ssm_dtype as the SSM state's dtype
# (Qwen3_5ForConditionalGenerationConfig, and Qwen4ExpForConditionalGenerationConfig built on it)
SSM_DTYPE_FROM_CONFIG = ("qwen3_5", "qwen4_exp")
# architectures whose KDA layers run FlashKDA's prefill kernel where it can (bf16, head size 128, a
# bounded gate; SM90/SM10x/SM12x) and then export prefill checkpoints (kimi_k3 and glm5next kda.py)
FLASHKDA_MODELS = (
    "KimiK3ForConditionalGeneration",
    "Glm5NextForCausalLM",
    "Glm5NextForConditionalGeneration",
)
# model_type: the state mixer beside each attention layer
PARALLEL_STATE_TYPES = {"falcon_h1": "mamba2", "zamba2": "mamba2"}


class LayerKind(NamedTuple):
    """One decoder layer: its token mixer and its MLP."""

    mixer: str  # one of MIXERS
    mlp: str  # one of MLPS


class AttentionShape(NamedTuple):
    """The KV shape of one attention kind's layers (per layer, before tensor parallelism)."""

    num_kv_heads: int
    head_dim: int
    window: int | None = None  # sliding window, or the chunk of chunked-local attention
    head_dim_v: int | None = None  # V's head size where it differs from K's (MiMo-V2), else None
    # MLA with DeepSeek-V3.2's sparse attention: each indexed layer also keeps its indexer's key
    # (uint8, whatever the KV dtype: index_head_dim + 4 bytes of scale per 128), here averaged
    # over the MLA layers (vLLM's UniformTypeKVCacheSpecs adds every layer's page to one block);
    # MiniMax-M3's full layers theirs (bf16), per token and layer on every TP rank
    extra_bytes: int = 0
    # MLA with sparse attention at an fp8 KV dtype: vLLM's fp8_ds_mla row (the latent in fp8, a
    # float32 scale per 128, the RoPE part in bf16: 656 bytes for DeepSeek-V3.2), else 0
    fp8_bytes: int = 0

    @property
    def kv_head_sum(self) -> int:
        """K's and V's head sizes together: one KV head's elements per token (vLLM
        ``AttentionSpec.real_page_size_bytes``: ``head_size + head_size_v``)."""
        return self.head_dim + (self.head_dim if self.head_dim_v is None else self.head_dim_v)


class StateDims(NamedTuple):
    """What vLLM's ``MambaStateShapeCalculator`` needs for one kind of state layer; the shapes
    themselves (per TP rank, with speculative tokens) come from :func:`state_shapes`."""

    kind: str  # gdn, mamba, mamba2, kda, linear, short_conv
    num_heads: int = 0  # gdn: value heads; mamba2/kda/linear: heads
    head_dim: int = 0  # gdn: value head dim; mamba2/kda/linear: head dim
    num_k_heads: int = 0  # gdn: key heads; kda: key heads
    head_k_dim: int = 0  # gdn: key head dim; kda: key head dim
    intermediate: int = 0  # mamba/mamba2: expand x hidden or heads x head dim; short_conv: its width
    n_groups: int = 0  # mamba2
    state_size: int = 0  # mamba/mamba2: d_state
    conv_kernel: int = 0  # all but linear
    ssm_dtype: str | None = None  # the config's own SSM state dtype (Qwen3.5 mamba_ssm_dtype)
    bounded_gate: bool = False  # kda: a gate lower bound is set (linear_attn_config.gate_lower_bound)


# DeepSeek V4's layer_types (transformers' DeepseekV4Config) -> the compression ratio
_DSV4_RATIOS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def dsv4_ratios(c: dict[str, Any], layers: int) -> list[int]:
    """DeepSeek V4's compression ratio per layer and MTP layer after them: ``compress_ratios`` (one
    entry a layer, then the MTP layers': 0 sliding-window only, 4 compressed sparse attention with an
    indexer, 128 heavily compressed), else ``layer_types`` by transformers' names."""
    ratios = c.get("compress_ratios")
    if ratios is None and isinstance(c.get("layer_types"), list):
        ratios = [_DSV4_RATIOS.get(t, -1) for t in c["layer_types"]]
    if type(ratios) is not list or len(ratios) < layers or any(r not in (0, 1, 4, 128) for r in ratios):
        raise ValueError(f"compress_ratios: expected at least {layers} entries of 0, 4 or 128")
    return [0 if r == 1 else r for r in ratios]


def is_dsv41(cfg: dict[str, Any]) -> bool:
    """A DeepSeek V4.1 config (``deepseek_v41``: its compressed caches on ``kv_source_layer_ids``)."""
    return _mtype(cfg).startswith("deepseek_v41")


def dsv41_ratios(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """DeepSeek V4.1's ratio per decoder layer (``compress_ratios``: 0 a sliding window only, 1 one
    compressed entry a token, 2 one per two; the DSpark stages' entries after them are not read;
    none: every layer 0, as ``deepseek_v41/attention.py`` reads a missing list)."""
    ratios = cfg.get("compress_ratios")
    if ratios is None:
        return (0,) * layers
    if type(ratios) is not list or len(ratios) < layers or any(r not in (0, 1, 2) for r in ratios[:layers]):
        raise ValueError(f"compress_ratios: expected at least {layers} entries of 0, 1 or 2 (DeepSeek V4.1)")
    return tuple(ratios[:layers])


def is_dsv4(cfg: dict[str, Any]) -> bool:
    """A DeepSeek V4 config with its compression ratios (``compress_ratios`` or ``layer_types``);
    ``ValueError`` where ``compress_ratios`` is there but not a list."""
    if _mtype(cfg) != "deepseek_v4":
        return False
    if "compress_ratios" in cfg and not isinstance(cfg["compress_ratios"], list):
        raise ValueError(
            f"compress_ratios: expected a list, one ratio a layer, got {cfg['compress_ratios']!r}"[:120]
        )
    return any(isinstance(cfg.get(k), list) for k in ("compress_ratios", "layer_types"))


class Compressed(NamedTuple):
    """DeepSeek V4's compressed attention (vLLM ``models/deepseek_v4``): every layer keeps a
    sliding window of ``window`` tokens; a layer of ratio 4 also one compressed entry per 4 tokens
    with the lightning indexer's key, a ratio-128 layer one per 128; each compressor its fp32 state."""

    ratios: tuple[int, ...]  # per decoder layer: 0, 4 or 128
    head_dim: int  # the one KV head (NoPE + RoPE)
    rope_dim: int
    index_dim: int
    window: int
    # DeepSeek V4.1: the layers that hold the compressed caches, the indexer's keys and the
    # compressor's state (kv_source_layer_ids; the others read the nearest source below them);
    # its ratios are then 0, 1 or 2 (deepseek_v41/attention.py)
    sources: tuple[int, ...] = ()


class Indexed(NamedTuple):
    """An indexer's caches beside each attention layer that vLLM packs with the attention's pages in
    one block (a block-outermost layout):

    - ``qsa``: Qwen4-Exp's QSA (``qwen4_exp/common/qsa_cache.py``, BLNHC): a compressed key of
      ``head_dim`` bf16 values per ``ratio`` tokens (``MLAAttentionSpec`` with ``tokens_per_state``)
      and a ring of the open group's raw keys (``CircularBufferSpec``: ``ratio`` plus the speculative
      tokens rounded up to ``ratio`` rows, ``head_dim`` wide plus three int64 positions under M-RoPE);
    - ``kpool``: GLM-5.3's pooled indexer beside MLA (``glm5next/common/attention.py``, BLHNC): one
      fp8 key and its scale per 128 per ``ratio`` (``index_kpool``) tokens, and a tail ring of raw
      keys and gate scores, ``ratio x next_pow2(cdiv(ratio + k, ratio))`` rows of 2 x ``head_dim``
      bf16 values."""

    head_dim: int
    ratio: int
    mrope: bool
    kind: str = "qsa"

    def key_row(self) -> int:
        """One key entry's bytes (kpool: fp8 with a float32 scale per 128 values; qsa: bf16)."""
        return self.head_dim + self.head_dim // 128 * 4 if self.kind == "kpool" else 2 * self.head_dim

    def key_bytes_per_token(self) -> int:
        return -(-self.key_row() // self.ratio)

    def key_page(self, block: int) -> int:
        return block // self.ratio * self.key_row()

    def ring_rows(self, num_spec: int = 0) -> int:
        groups = -(-(self.ratio + num_spec) // self.ratio)
        if self.kind == "kpool":
            return self.ratio * (1 << (groups - 1).bit_length())
        return groups * self.ratio

    def ring_page(self, num_spec: int = 0) -> int:
        rows = self.ring_rows(num_spec)
        if self.kind == "kpool":
            return rows * 2 * self.head_dim * 2
        width = -(-self.head_dim // 4) * 4 + 3 * 4 if self.mrope else self.head_dim
        return rows * width * 2

    def alignment(self, mla_row: int) -> int:
        """The block stride's alignment: kpool's MLA rows (``align_blocks_to_rows``) and its indexer's
        256-token kernel blocks; none for QSA."""
        if self.kind != "kpool":
            return 1
        return math.lcm(mla_row, self.key_page(256))


class ShortConv(NamedTuple):
    """A short-conv state beside the recurrent state, the same on every TP rank: Qwen4-Exp's PLE
    layers (``ple_layer.py``: ``hc_count x hidden`` channels, ``(ple_conv_kernel_size - 1) x
    ngram_size`` columns plus the speculative tokens, in the model dtype)."""

    layers: int
    width: int
    length: int

    def page(self, dtype_bytes: int, num_spec: int = 0) -> int:
        return self.width * (self.length + num_spec) * dtype_bytes


class Sconv(NamedTuple):
    """Inkling's short-conv state in every layer (``sconv_swa_attn.py`` ``InklingConvState``): vLLM
    keeps it as a sliding window of ``kernel`` tokens (one block), each row the layer's K, V,
    attention-output and MLP-output streams, ``next_pow2(2 x head_dim + 2 x hidden / kv_heads)``
    values a KV head, in the model dtype, split by tensor parallelism like the KV heads."""

    kernel: int
    hidden: int

    def width(self, shape: AttentionShape) -> int:
        raw = 2 * shape.head_dim + 2 * self.hidden // max(1, shape.num_kv_heads)
        return 1 << (raw - 1).bit_length()


class LayerStack(NamedTuple):
    """The model's layers (:func:`layer_kinds`), the shape of each attention kind present, the
    state dimensions where the model has state layers, and the layers that reuse an earlier
    layer's KV (Gemma-3n/4 ``num_kv_shared_layers``: no cache of their own)."""

    kinds: tuple[LayerKind, ...]
    attention: dict[str, AttentionShape]
    state: StateDims | None = None
    kv_shared: frozenset[int] = frozenset()
    # config.json's layer_types lists "linear_attention" (vLLM's CPU platform keys its accelerated
    # state backend, and so the SSM dtype it keeps, on that: platforms/cpu.py _cpu_mamba_backend)
    linear_attention_types: bool = False
    # every attention layer also runs a state mixer of kind ``state.kind`` beside it (Falcon-H1):
    # one state layer more per attention layer, as vLLM registers them
    parallel_state: bool = False
    compressed: Compressed | None = None  # DeepSeek V4's compressed attention
    indexed: Indexed | None = None  # Qwen4-Exp's QSA caches beside each attention layer
    short_conv: ShortConv | None = None  # Qwen4-Exp's PLE state beside the recurrent state
    sconv: Sconv | None = None  # Inkling's short-conv state in every layer

    def count(self, mixer: str) -> int:
        return sum(1 for k in self.kinds if k.mixer == mixer)

    def attention_layers(self) -> list[tuple[int, str]]:
        """``(index, kind)`` of every attention layer that holds its own KV."""
        return [
            (i, k.mixer)
            for i, k in enumerate(self.kinds)
            if k.mixer in ATTENTION_MIXERS and i not in self.kv_shared
        ]

    @property
    def state_layers(self) -> int:
        beside = sum(1 for k in self.kinds if k.mixer in ATTENTION_MIXERS) if self.parallel_state else 0
        return sum(1 for k in self.kinds if k.mixer in STATE_MIXERS) + beside

    @property
    def is_hybrid_state(self) -> bool:
        return self.state is not None and self.state_layers > 0


def _name(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    mtype = cfg.get("model_type")
    return arch or (mtype if isinstance(mtype, str) else "this model")


def _int(cfg: dict[str, Any], key: str, default: int | None = None, lo: int = 0) -> int | None:
    v = cfg.get(key)
    if v is None:
        return default
    if type(v) is not int or v < lo or v > 1 << 32:
        raise ValueError(f"{key}: expected an integer >= {lo}, got {v!r}"[:120])
    return v


def _need(cfg: dict[str, Any], key: str, why: str, alt: tuple[str, ...] = ()) -> int:
    for k in (key, *alt):
        v = _int(cfg, k, lo=1)
        if v is not None:
            return v
    raise ValueError(f"{_name(cfg)}: {key} missing from config.json; needed for {why}")


def _int_list(cfg: dict[str, Any], key: str) -> list[int] | None:
    v = cfg.get(key)
    if v is None:
        return None
    if type(v) is not list or not all(type(i) is int for i in v):
        raise ValueError(f"{key}: expected a list of integers, got {v!r}"[:120])
    return v


def _mtype(cfg: dict[str, Any]) -> str:
    v = cfg.get("model_type")
    return v if type(v) is str else ""


def _experts(cfg: dict[str, Any]) -> int:
    from .arch import EXPERT_KEYS

    for key in EXPERT_KEYS:
        v = _int(cfg, key)
        if v:
            return v
    return 0


def _mlp_kinds(cfg: dict[str, Any], n: int) -> list[str]:
    """Dense or MoE per layer, by the family's rule (``arch.moe_layer_indices``; Jamba's and
    Llama-4's periods)."""
    from .arch import moe_layer_indices

    experts = _experts(cfg)
    if not experts:
        return ["dense"] * n
    if "expert_layer_period" in cfg:  # Jamba
        period = _int(cfg, "expert_layer_period", 1, lo=1) or 1
        offset = _int(cfg, "expert_layer_offset", 0) or 0
        return ["moe" if i % period == offset else "dense" for i in range(n)]
    if "interleave_moe_layer_step" in cfg:  # Llama-4
        step = _int(cfg, "interleave_moe_layer_step", 1) or 0
        return ["moe" if step and (i + 1) % step == 0 else "dense" for i in range(n)]
    moe = set(moe_layer_indices(cfg, n, experts))
    return ["moe" if i in moe else "dense" for i in range(n)]


_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "global": "full",
    "full": "full",
    "sliding_attention": "sliding",
    "sliding_window_attention": "sliding",
    "local_attention": "sliding",
    "sliding": "sliding",
    "chunked_attention": "chunked",
    "chunked_local_attention": "chunked",
    "linear_attention": "linear_attention",  # GDN (Qwen3-Next/3.5) or Mamba2 (Granite-4, Nemotron-H): by the dims
    "mamba": "mamba2",  # Granite-4: Mamba2 mixers
    "mamba2": "mamba2",
    "kda": "kda",
    "conv": "short_conv",  # LFM2: a gated short convolution, its state the last L - 1 inputs
}


def _sliding_count(cfg: dict[str, Any], layers: int) -> int:
    """hwprofile's rule before the layer stack (kept: golden renders depend on it)."""
    if not cfg.get("sliding_window") or cfg.get("use_sliding_window") is False:
        return 0
    if cfg.get("model_type") == "gemma2":
        return layers // 2
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        return layers - layers // pattern
    return layers


def _mixers(cfg: dict[str, Any], n: int) -> list[str]:
    """Each layer's token mixer, from the first of the config's ways of saying it that it uses."""
    name = _name(cfg)
    mtype = _mtype(cfg)
    if mtype == "zamba":
        raise ValueError(f"{name}: a zamba (v1) model: vLLM runs Zamba2, not the first Zamba")
    if mtype == "zamba2":
        return ["full" if b == "hybrid" else "mamba2" for b in zamba2_blocks(cfg, n, name)]
    if mtype in PARALLEL_STATE_TYPES:  # attention in every layer, its Mamba2 mixer counted by parallel_state
        return ["full"] * n
    for read in _MIXER_READERS:
        mixers = read(cfg, n, name, mtype)
        if mixers is not None:
            return mixers
    return _sliding_mixers(cfg, n, mtype)


def zamba2_blocks(cfg: dict[str, Any], n: int, name: str) -> list[str]:
    """Zamba2's ``layers_block_type`` (``hybrid``, and ``mamba`` or transformers 5's
    ``linear_attention``), else its ``hybrid_layer_ids``, one entry a layer."""
    blocks = cfg.get("layers_block_type")
    if blocks is None:
        ids = _int_list(cfg, "hybrid_layer_ids")
        if ids is None:
            raise ValueError(
                f"{name}: neither layers_block_type nor hybrid_layer_ids says which layers are hybrid"
            )
        hybrid = set(ids)
        if len(hybrid) != len(ids) or not hybrid <= set(range(n)):
            raise ValueError(f"{name}: hybrid_layer_ids must be distinct layer indices below {n}")
        blocks = ["hybrid" if i in hybrid else "mamba" for i in range(n)]
    kinds = ("hybrid", "mamba", "linear_attention")
    if type(blocks) is not list or len(blocks) != n or any(b not in kinds for b in blocks):
        raise ValueError(
            f"{name}: layers_block_type must be {n} entries of hybrid, mamba or linear_attention"
        )
    return blocks


def _hybrid_pattern_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Nemotron-H: ``hybrid_override_pattern`` (or transformers 5's ``layers_block_type``)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        pattern = pattern_of_blocks(cfg.get("layers_block_type"))
    if pattern is None:
        return None
    if type(pattern) is not str or len(pattern) != n or set(pattern) - set("M*-E"):
        raise ValueError(
            f"{name}: hybrid_override_pattern must be {n} characters of M, *, - and E, got {pattern!r}"[:160]
        )
    return [{"M": "mamba2", "*": "full", "-": "none", "E": "none"}[c] for c in pattern]


def _kimi_linear_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Kimi-Linear, Kimi-K3: ``linear_attn_config`` lists the KDA and the full layers (1-based numbers).
    Another family that writes the lists (GLM-5.3: 0-based, not read by vLLM) is read by its
    ``layer_types``."""
    lac = cfg.get("linear_attn_config")
    if not isinstance(lac, dict) or (
        not mtype.startswith("kimi") and isinstance(cfg.get("layer_types"), list)
    ):
        return None
    kda = lac.get("kda_layers") or []
    full = lac.get("full_attn_layers") or []
    if type(kda) is not list or type(full) is not list:
        raise ValueError(f"{name}: linear_attn_config.kda_layers/full_attn_layers must be lists")
    attn = "mla" if cfg.get("kv_lora_rank") else "full"
    out = []
    for i in range(1, n + 1):
        if i in kda:
            out.append("kda")
        elif i in full:
            out.append(attn)
        else:
            raise ValueError(f"{name}: layer {i} is in neither kda_layers nor full_attn_layers")
    return out


def _coded(cfg: dict[str, Any], key: str, n: int, name: str, by_code: dict[int, str]) -> list[str] | None:
    """A list of one code a layer under ``key``, each code's mixer in ``by_code``; None without it."""
    codes = cfg.get(key)
    if codes is None:
        return None
    if type(codes) is not list or len(codes) != n or any(c not in by_code for c in codes):
        said = " or ".join(f"{c} ({mixer})" for c, mixer in by_code.items())
        raise ValueError(f"{name}: {key} must be {n} entries of {said}")
    return [by_code[c] for c in codes]


def _minimax_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """MiniMax-Text-01: ``attn_type_list``, 0 linear and 1 softmax per layer."""
    return _coded(cfg, "attn_type_list", n, name, {0: "linear", 1: "full"})


def _mimo_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """MiMo-V2: ``hybrid_layer_pattern``, 1 a sliding-window layer and 0 a full one (``mimo_v2.py``
    ``is_compressed_softmax_layer``)."""
    return _coded(cfg, "hybrid_layer_pattern", n, name, {0: "full", 1: "sliding"})


def _local_layer_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Inkling: ``local_layer_ids`` are sliding-window layers (``sliding_window_size``, ``swa_*``
    heads), the others full (``models/inkling``)."""
    ids = cfg.get("local_layer_ids")
    if ids is None or not mtype.startswith("inkling"):
        return None
    if (
        type(ids) is not list
        or len(set(ids)) != len(ids)
        or not all(type(i) is int and 0 <= i < n for i in ids)
    ):
        raise ValueError(
            f"local_layer_ids: expected distinct layer numbers from 0 to {n - 1}, got {ids!r}"[:160]
        )
    local = set(ids)
    return ["sliding" if i in local else "full" for i in range(n)]


def _bailing_linear_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Bailing MoE V2.5 (Ling/Ring linear): lightning linear attention, an MLA layer closing every
    group of ``layer_group_size`` (``bailing_moe_linear.py`` ``is_linear_layer``)."""
    if name not in BAILING_LINEAR + BAILING_KDA or "layer_group_size" not in cfg:
        return None
    group = _int(cfg, "layer_group_size", 0) or 0
    if name in BAILING_KDA:  # V3: KDA, and the layers after the last whole group MLA too
        whole = n // group * group if group else 0
        return ["kda" if group > 0 and (i + 1) % group and i < whole else "mla" for i in range(n)]
    return ["linear" if group > 0 and (i + 1) % group else "mla" for i in range(n)]


def _jamba_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Jamba: an attention layer every ``attn_layer_period``, from ``attn_layer_offset``; Mamba between."""
    if "attn_layer_period" not in cfg:
        return None
    period = _need(cfg, "attn_layer_period", "Jamba's layer pattern")
    offset = _int(cfg, "attn_layer_offset", 0) or 0
    return ["full" if i % period == offset else "mamba" for i in range(n)]


def _bamba_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Bamba: ``attn_layer_indices`` are attention, the others Mamba2."""
    indices = _int_list(cfg, "attn_layer_indices")
    if indices is None or "layer_types" in cfg:
        return None
    return ["full" if i in set(indices) else "mamba2" for i in range(n)]


def _layer_types_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """``layer_types``, one name a layer; its linear_attention layers are GDN or Mamba2 by the
    dimensions the config gives, and its full layers MLA where the config has a KV LoRA rank."""
    types = cfg.get("layer_types")
    if not (isinstance(types, list) and types):
        return None
    if len(types) < n:
        raise ValueError(f"{name}: layer_types lists {len(types)} layers, num_hidden_layers is {n}")
    out = [_layer_type_mixer(t, name) for t in types[:n]]
    if "linear_attention" in out:
        linear = _linear_attention_kind(cfg, name)
        out = [linear if m == "linear_attention" else m for m in out]
    if "mla" not in out and cfg.get("kv_lora_rank"):
        out = ["mla" if m == "full" else m for m in out]
    return out


def _layer_type_mixer(t: str, name: str) -> str:
    if t in _TYPE_NAMES:
        return _TYPE_NAMES[t]
    if "sliding" in t or "local" in t:
        return "sliding"
    if "attention" in t and "linear" not in t:
        return "full"
    raise ValueError(f"{name}: layer_types has {t!r}, a layer kind hwprofile does not know")


def _linear_attention_kind(cfg: dict[str, Any], name: str) -> str:
    """What a ``linear_attention`` layer is: KDA by the architecture (:data:`KDA_LINEAR`), else GDN
    or Mamba2 by the dimensions the config gives."""
    if name in KDA_LINEAR:
        return "kda"
    if "linear_num_value_heads" in cfg:
        return "gdn"
    if any(k in cfg for k in ("mamba_n_heads", "mamba_num_heads", "mamba_d_state", "ssm_state_size")):
        return "mamba2"
    raise ValueError(
        f"{name}: layer_types has linear_attention layers, but neither GDN (linear_num_value_heads) "
        "nor Mamba2 (mamba_n_heads) dimensions"
    )


def _qwen3_next_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Qwen3-Next / Qwen3.5: a full attention layer every ``full_attention_interval``, GDN between."""
    interval = _int(cfg, "full_attention_interval")
    if interval and mtype.startswith(("qwen3_next", "qwen3_5")):
        return ["full" if (i + 1) % interval == 0 else "gdn" for i in range(n)]
    return None


def _llama4_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Llama 4: chunked attention, but global on its ``no_rope_layers``."""
    chunk = _int(cfg, "attention_chunk_size")
    nope = _int_list(cfg, "no_rope_layers")
    if not (chunk and mtype.startswith("llama4")):
        return None
    if nope is None:  # transformers' default: every no_rope_layer_interval-th layer is global
        step = _int(cfg, "no_rope_layer_interval", 4, lo=1) or 4
        nope = [0 if (i + 1) % step == 0 else 1 for i in range(n)]
    if len(nope) < n:
        raise ValueError(f"{name}: no_rope_layers lists {len(nope)} layers, num_hidden_layers is {n}")
    return ["full" if nope[i] == 0 else "chunked" for i in range(n)]


def _unsaid_linear_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """Refuse a Qwen3-Next-style config with linear layers that does not say which layers they are."""
    if mtype.startswith(("qwen3_next", "qwen3_5")) and "linear_num_value_heads" in cfg:
        raise ValueError(
            f"{name}: neither layer_types nor full_attention_interval says which layers are linear"
        )
    return None


def _mla_mixers(cfg: dict[str, Any], n: int, name: str, mtype: str) -> list[str] | None:
    """A KV LoRA rank: every layer is MLA."""
    return ["mla"] * n if cfg.get("kv_lora_rank") else None


def _sliding_mixers(cfg: dict[str, Any], n: int, mtype: str) -> list[str]:
    """Full and sliding-window layers by hwprofile's sliding-window count and the model's pattern."""
    sliding = _sliding_count(cfg, n)
    if not sliding:
        return ["full"] * n
    if sliding == n:
        return ["sliding"] * n
    if mtype == "gemma2":
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    pattern_n = cfg.get("sliding_window_pattern")
    if isinstance(pattern_n, int) and pattern_n > 1:
        return ["full" if (i + 1) % pattern_n == 0 else "sliding" for i in range(n)]
    return ["sliding"] * sliding + ["full"] * (n - sliding)


# A config's ways of saying each layer's mixer, in the order they are asked: (cfg, layers, the
# model's name for messages, model_type) -> the mixers, or None where the config does not say it so.
_MIXER_READERS: tuple[Callable[[dict[str, Any], int, str, str], list[str] | None], ...] = (
    _hybrid_pattern_mixers,
    _kimi_linear_mixers,
    _minimax_mixers,
    _mimo_mixers,
    _local_layer_mixers,
    _bailing_linear_mixers,
    _jamba_mixers,
    _bamba_mixers,
    _layer_types_mixers,
    _qwen3_next_mixers,
    _llama4_mixers,
    _unsaid_linear_mixers,
    _mla_mixers,
)


_BLOCK_CHARS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}


def pattern_of_blocks(blocks: object) -> str | None:
    """Nemotron-H's ``layers_block_type`` (transformers 5: ``mamba``/``linear_attention``,
    ``attention``/``full_attention``, ``mlp``, ``moe`` per layer) as a ``hybrid_override_pattern``."""
    if (
        type(blocks) is not list
        or not blocks
        or not all(type(b) is str and b in _BLOCK_CHARS for b in blocks)
    ):
        return None
    return "".join(_BLOCK_CHARS[b] for b in blocks)


def layer_kinds(cfg: dict[str, Any]) -> tuple[LayerKind, ...]:
    """Every decoder layer's :class:`LayerKind`, in order, from a config.json dict (a multimodal
    model's ``text_config`` merged over it first, as :func:`hwprofile.model.parse_config` does).
    ``ValueError`` naming the architecture where the config does not say enough."""
    cfg = _merged(cfg)
    blocks = cfg.get("layers_block_type")
    if cfg.get("num_hidden_layers") is None and isinstance(blocks, list) and pattern_of_blocks(blocks):
        cfg = {**cfg, "num_hidden_layers": len(blocks)}  # transformers 5's Nemotron-H derives it
    n = _need(cfg, "num_hidden_layers", "the layer stack")
    mixers = _mixers(cfg, n)
    mlps = _mlp_kinds(cfg, n)
    pattern = cfg.get("hybrid_override_pattern") or pattern_of_blocks(cfg.get("layers_block_type"))
    if isinstance(pattern, str):  # Nemotron-H: mixer-only and MLP-only layers
        mlps = [{"M": "none", "*": "none", "-": "dense", "E": "moe"}[c] for c in pattern]
    if _mtype(cfg) == "zamba2":  # the shared block's MLP runs in the hybrid layers only
        mlps = ["dense" if m == "full" else "none" for m in mixers]
    return tuple(LayerKind(m, p) for m, p in zip(mixers, mlps, strict=True))


def _merged(cfg: dict[str, Any]) -> dict[str, Any]:
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) and text else cfg


def _attention_shapes(cfg: dict[str, Any], kinds: tuple[LayerKind, ...]) -> dict[str, AttentionShape]:
    heads = _int(cfg, "num_attention_heads", lo=1) or 0
    kv = _int(cfg, "num_key_value_heads", lo=1) or heads
    head_dim = _int(cfg, "head_dim", lo=1) or ((_int(cfg, "hidden_size", lo=1) or 0) // max(1, heads))
    if _mtype(cfg) == "zamba2":  # attention over [hidden, embedding]: 2 x hidden wide, every head a KV head
        wide = 2 * (_int(cfg, "hidden_size", lo=1) or 0) // max(1, heads)
        kv, head_dim = heads, _int(cfg, "head_dim", lo=1) or _int(cfg, "attention_head_dim", lo=1) or wide
    present = {k.mixer for k in kinds}
    out: dict[str, AttentionShape] = {}
    # V's own head size (MiMo-V2's v_head_dim; DeepSeek's v_head_dim belongs to MLA, sized apart)
    v_dim = None if cfg.get("kv_lora_rank") else _int(cfg, "v_head_dim", lo=1)
    if "full" in present:
        g_dim = _int(cfg, "global_head_dim", lo=1) or head_dim
        g_kv = _int(cfg, "num_global_key_value_heads", lo=1) or kv
        full = [i for i, k in enumerate(kinds) if k.mixer == "full"]
        out["full"] = AttentionShape(
            g_kv, g_dim, None, v_dim if v_dim != g_dim else None, _sparse_index_bytes(cfg, full)
        )
    if "sliding" in present:
        out["sliding"] = _sliding_shape(cfg, kv, head_dim, v_dim)
    if "chunked" in present:
        out["chunked"] = AttentionShape(kv, head_dim, _int(cfg, "attention_chunk_size"))
    if "mla" in present:
        out["mla"] = _mla_shape(cfg, [i for i, k in enumerate(kinds) if k.mixer == "mla"])
    if any(s.head_dim <= 0 or s.num_kv_heads <= 0 for s in out.values()):
        raise ValueError(f"{_name(cfg)}: the attention heads are not given (num_attention_heads/head_dim)")
    return out


def indexed_layers(cfg: dict[str, Any], layers: int) -> frozenset[int]:
    """The layers of a DeepSeek-V3.2-style sparse-attention model that compute their own top-k, and
    so hold an indexer and its key cache (``deepseek_v2.py``: every ``index_topk_freq``-th from
    ``index_skip_topk_offset``, or ``index_topk_pattern``'s non-``S`` layers; HY-V4's ``indexer_types``:
    its ``full`` layers, the ``shared`` ones reusing the last full layer's top-k, hy_v4
    ``compute_skip_topk_layers``)."""
    types = cfg.get("indexer_types")
    if type(types) is list and types:
        if len(types) != layers or any(t not in ("full", "shared") for t in types):
            raise ValueError(f"indexer_types: expected {layers} entries of full or shared")
        return frozenset(i for i, t in enumerate(types) if t == "full")
    pattern = cfg.get("index_topk_pattern")
    if isinstance(pattern, str) and pattern:
        return frozenset(i for i in range(layers) if i >= len(pattern) or pattern[i] != "S")
    freq = _int(cfg, "index_topk_freq", lo=1) or 1
    offset = _int(cfg, "index_skip_topk_offset", 2) or 0
    return frozenset(i for i in range(layers) if max(i - offset + 1, 0) % freq == 0)


def _sparse_index_bytes(cfg: dict[str, Any], full: list[int]) -> int:
    """MiniMax-M3's sparse attention (``sparse_attention_config``): each layer whose
    ``sparse_attention_freq`` entry is not 0 also keeps its indexer's key, ``sparse_index_dim`` bf16
    values a token on every TP rank (``MiniMaxM3IndexerCache``: ``MLAAttentionSpec``, one head),
    averaged over the full-attention layers as :attr:`AttentionShape.extra_bytes`; 0 for any other."""
    sparse = cfg.get("sparse_attention_config")
    if not _mtype(cfg).startswith("minimax_m3") or not isinstance(sparse, dict):
        return 0
    if not sparse.get("use_sparse_attention") or not full:
        return 0
    freq = sparse.get("sparse_attention_freq")
    n = _int(cfg, "num_hidden_layers", lo=1) or 0
    if not isinstance(freq, list) or len(freq) < n or not all(type(f) is int for f in freq):
        raise ValueError(f"sparse_attention_config.sparse_attention_freq: expected {n} integers, one a layer")
    dim = _int(sparse, "sparse_index_dim", 128, lo=1) or 128
    indexed = sum(1 for i in full if freq[i])
    return -(-2 * dim * indexed // len(full))


def _mla_shape(cfg: dict[str, Any], mla: list[int]) -> AttentionShape:
    """The MLA latent (``kv_lora_rank + qk_rope_head_dim`` elements); with DeepSeek-V3.2's sparse
    attention (``index_topk``) the indexer keys of the layers that compute their own top-k
    (``deepseek_v2.py``: every ``index_topk_freq``-th from ``index_skip_topk_offset``, or
    ``index_topk_pattern``'s non-``S`` layers) and the fp8_ds_mla row at an fp8 KV dtype."""
    rank = _need(cfg, "kv_lora_rank", "the MLA latent")
    rope = _int(cfg, "qk_rope_head_dim", 0) or 0
    if "index_topk" not in cfg:
        return AttentionShape(1, rank + rope)
    head = _int(cfg, "index_head_dim", lo=1) or 128
    layers = len(mla)
    indexed = len(indexed_layers(cfg, _int(cfg, "num_hidden_layers", lo=1) or layers) & set(mla))
    # one key (and its fp32 scale per 128) per index_kpool tokens where the indexer pools keys
    # (GLM-5.3: MLAAttentionSpec tokens_per_state = index_kpool)
    pool = _int(cfg, "index_kpool", 1, lo=1) or 1
    per_layer = -(-(head + head // 128 * 4) // pool)
    extra = -(-per_layer * indexed // max(1, layers))
    return AttentionShape(1, rank + rope, None, None, extra, rank + rank // 128 * 4 + rope * 2)


def _sliding_shape(cfg: dict[str, Any], kv: int, head_dim: int, v_dim: int | None) -> AttentionShape:
    """The sliding-window layers' shape: the model's heads, or MiMo-V2's own ``swa_*`` ones (its
    window ``sliding_window_size``)."""
    window = cfg.get("sliding_window_size", cfg.get("sliding_window"))
    if window is None and _mtype(cfg).startswith("inkling"):  # InklingModelConfig's default
        window = 512
    if "swa_num_key_value_heads" in cfg or "swa_head_dim" in cfg:
        kv = _int(cfg, "swa_num_key_value_heads", lo=1) or kv
        head_dim = _int(cfg, "swa_head_dim", lo=1) or head_dim
        v_dim = _int(cfg, "swa_v_head_dim", lo=1)  # absent: V as wide as K (mimo_v2.py)
    return AttentionShape(
        kv,
        head_dim,
        window if type(window) is int and window > 0 else None,
        v_dim if v_dim != head_dim else None,
    )


def _gdn_dims(cfg: dict[str, Any], why: str, hidden: int, ssm_dtype: str | None) -> StateDims:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5)."""
    return StateDims(
        "gdn",
        num_heads=_need(cfg, "linear_num_value_heads", why),
        head_dim=_need(cfg, "linear_value_head_dim", why),
        num_k_heads=_need(cfg, "linear_num_key_heads", why),
        head_k_dim=_need(cfg, "linear_key_head_dim", why),
        conv_kernel=_need(cfg, "linear_conv_kernel_dim", why),
        ssm_dtype=ssm_dtype,
    )


def _mamba2_dims(cfg: dict[str, Any], why: str, hidden: int, ssm_dtype: str | None) -> StateDims:
    """Mamba2: Nemotron-H's names (``mamba_num_heads``, ...), else the ``mamba_n_heads``/``mamba_d_*`` ones."""
    if "mamba_num_heads" in cfg:  # Nemotron-H
        heads = _need(cfg, "mamba_num_heads", why)
        hd = _need(cfg, "mamba_head_dim", why)
        return StateDims(
            "mamba2",
            num_heads=heads,
            head_dim=hd,
            intermediate=heads * hd,
            n_groups=_need(cfg, "n_groups", why),
            state_size=_need(cfg, "ssm_state_size", why),
            conv_kernel=_need(cfg, "conv_kernel", why),
            ssm_dtype=nemo if type(nemo := cfg.get("mamba_ssm_cache_dtype")) is str else "float32",
        )
    if _mtype(cfg) == "zamba2":  # zamba2.py; unset keys take transformers' Zamba2Config defaults
        inner = (_int(cfg, "mamba_expand", 2, lo=1) or 2) * hidden
        heads = _int(cfg, "n_mamba_heads", 8, lo=1) or 8
        return StateDims(
            "mamba2",
            num_heads=heads,
            head_dim=_int(cfg, "mamba_headdim", lo=1) or inner // heads,
            intermediate=inner,
            n_groups=_int(cfg, "mamba_ngroups", 1, lo=1) or 1,
            state_size=_int(cfg, "mamba_d_state", 64, lo=1) or 64,
            conv_kernel=_int(cfg, "mamba_d_conv", 4, lo=1) or 4,
            ssm_dtype=ssm_dtype,
        )
    # the inner width: Falcon-H1's mamba_d_ssm where it says one (falcon_h1.py), else expand x hidden
    d_ssm = _int(cfg, "mamba_d_ssm", lo=1)
    return StateDims(
        "mamba2",
        num_heads=_need(cfg, "mamba_n_heads", why),
        head_dim=_need(cfg, "mamba_d_head", why),
        intermediate=d_ssm or _need(cfg, "mamba_expand", why) * hidden,
        n_groups=_need(cfg, "mamba_n_groups", why),
        state_size=_need(cfg, "mamba_d_state", why),
        conv_kernel=_need(cfg, "mamba_d_conv", why),
        ssm_dtype=ssm_dtype,
    )


def _mamba_dims(cfg: dict[str, Any], why: str, hidden: int, ssm_dtype: str | None) -> StateDims:
    """Mamba1 (Jamba)."""
    return StateDims(
        "mamba",
        intermediate=_need(cfg, "mamba_expand", why) * hidden,
        state_size=_need(cfg, "mamba_d_state", why),
        conv_kernel=_need(cfg, "mamba_d_conv", why),
        ssm_dtype=ssm_dtype,
    )


def kda_geometry(cfg: dict[str, Any], why: str) -> tuple[int, int, int]:
    """Kimi Delta Attention's heads, head size and short-convolution kernel, as each family says
    them: Kimi-Linear's ``linear_attn_config``; AliceAI's ``linear_num_key_heads``,
    ``linear_key_head_dim``, ``linear_conv_kernel_dim`` (alice_ai.py); Bailing V3's attention heads,
    ``head_dim`` and ``short_conv_kernel_size`` (bailing_moe_v3.py)."""
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, dict):
        conv = _int(lac, "short_conv_kernel_size", 4, lo=1) or 4
        return _need(lac, "num_heads", why), _need(lac, "head_dim", why), conv
    if "linear_num_key_heads" in cfg:
        conv = _int(cfg, "linear_conv_kernel_dim", 4, lo=1) or 4
        return _need(cfg, "linear_num_key_heads", why), _need(cfg, "linear_key_head_dim", why), conv
    heads = _need(cfg, "num_attention_heads", why)
    hd = _int(cfg, "head_dim", lo=1) or (_int(cfg, "hidden_size", lo=1) or 0) // heads
    return heads, hd, _int(cfg, "short_conv_kernel_size", 4, lo=1) or 4


def _kda_dims(cfg: dict[str, Any], why: str, hidden: int, ssm_dtype: str | None) -> StateDims:
    """Kimi Delta Attention (:func:`kda_geometry`); the SSM state in float32."""
    heads, hd, conv = kda_geometry(cfg, why)
    lac = v if isinstance(v := cfg.get("linear_attn_config"), dict) else {}
    bound = lac.get("gate_lower_bound", cfg.get("kda_lower_bound", cfg.get("gate_lower_bound")))
    return StateDims(
        "kda",
        num_heads=heads,
        head_dim=hd,
        num_k_heads=_int(lac, "num_k_heads", heads, lo=1) or heads,
        head_k_dim=_int(lac, "head_k_dim", hd, lo=1) or hd,
        conv_kernel=conv,
        ssm_dtype="float32",
        bounded_gate=type(bound) in (int, float),
    )


def _short_conv_dims(cfg: dict[str, Any], why: str, hidden: int, ssm_dtype: str | None) -> StateDims:
    """LFM2's gated short convolution: one conv state of the convolution's width (LFM2's ``conv_dim``;
    LFM2-MoE convolves the hidden size, ``lfm2_moe.py``) and ``conv_L_cache - 1`` past inputs."""
    width = _int(cfg, "conv_dim", lo=1) if _mtype(cfg) == "lfm2" else None
    return StateDims(
        "short_conv",
        intermediate=width or hidden,
        conv_kernel=_need(cfg, "conv_L_cache", why),
    )


def _state_dims(cfg: dict[str, Any], kinds: tuple[LayerKind, ...]) -> StateDims | None:
    present = {k.mixer for k in kinds} & set(STATE_MIXERS)
    if _mtype(cfg) in PARALLEL_STATE_TYPES:
        present.add(PARALLEL_STATE_TYPES[_mtype(cfg)])
    if not present:
        return None
    if len(present) > 1:
        raise ValueError(f"{_name(cfg)}: state layers of several kinds ({sorted(present)}) are not modelled")
    kind = present.pop()
    # the SSM state's dtype under vLLM's --mamba-ssm-cache-dtype auto (None: the conv state's, the
    # model dtype): Qwen3.5 takes its config's mamba_ssm_dtype (Qwen3_5ForConditionalGenerationConfig.
    # verify_and_update_config), Nemotron-H its mamba_ssm_cache_dtype or float32, KDA float32
    ssm = cfg.get("mamba_ssm_dtype") if _mtype(cfg).startswith(SSM_DTYPE_FROM_CONFIG) else None
    ssm_dtype = ssm if type(ssm) is str else None
    why = f"the {kind} state"
    hidden = _int(cfg, "hidden_size", lo=1) or 0
    by_kind = {
        "gdn": _gdn_dims,
        "mamba2": _mamba2_dims,
        "mamba": _mamba_dims,
        "kda": _kda_dims,
        "short_conv": _short_conv_dims,
    }
    if kind in by_kind:
        return by_kind[kind](cfg, why, hidden, ssm_dtype)
    # linear (MiniMax lightning attention): one (heads, head_dim, head_dim) state per layer
    heads = _need(cfg, "num_attention_heads", why)
    return StateDims(
        "linear",
        num_heads=heads,
        head_dim=_int(cfg, "head_dim", lo=1) or hidden // heads,
        ssm_dtype=ssm_dtype,
    )


def layer_stack(cfg: dict[str, Any]) -> LayerStack:
    """:func:`layer_kinds` with each attention kind's shape and the state dimensions."""
    cfg = _merged(cfg)
    kinds = layer_kinds(cfg)
    if cfg.get("num_hidden_layers") is None:
        cfg = {**cfg, "num_hidden_layers": len(kinds)}
    if not any(k.mixer in ATTENTION_MIXERS for k in kinds) and any(k.mixer in STATE_MIXERS for k in kinds):
        raise ValueError(f"{_name(cfg)}: an attention-free state model (no attention layer): not modelled")
    shared_n = _int(cfg, "num_kv_shared_layers", 0) or 0
    shared = frozenset(range(len(kinds) - shared_n, len(kinds))) if shared_n else frozenset()
    types = cfg.get("layer_types")
    linear = isinstance(types, list) and "linear_attention" in types
    parallel = _mtype(cfg) in PARALLEL_STATE_TYPES
    state = _state_dims(cfg, kinds)
    return LayerStack(
        kinds,
        _attention_shapes(cfg, kinds),
        state,
        shared,
        linear,
        parallel,
        _compressed(cfg),
        _indexed(cfg, kinds),
        _short_conv(cfg, len(kinds)) if state is not None else None,
        _sconv(cfg),
    )


def _sconv(cfg: dict[str, Any]) -> Sconv | None:
    """Inkling's short-conv state (built in every layer whatever ``use_sconv`` says)."""
    if not _mtype(cfg).startswith("inkling"):
        return None
    kernel = _int(cfg, "sconv_kernel_size", lo=1) or _int(cfg, "conv_kernel_size", lo=1) or 4
    return Sconv(kernel, _need(cfg, "hidden_size", "Inkling's short-conv state"))


def _indexed(cfg: dict[str, Any], kinds: tuple[LayerKind, ...]) -> Indexed | None:
    """Qwen4-Exp's QSA (its attention layers, where the config names the indexer's compression);
    GLM-5.3's pooled indexer beside MLA in a hybrid (``index_kpool`` above 1)."""
    pool = _int(cfg, "index_kpool", 1, lo=1) or 1
    mixers = {k.mixer for k in kinds}
    if pool > 1 and "index_topk" in cfg and "mla" in mixers and mixers & set(STATE_MIXERS):
        return Indexed(_int(cfg, "index_head_dim", lo=1) or 128, pool, False, "kpool")
    if not _mtype(cfg).startswith("qwen4_exp") or cfg.get("indexer_n_heads") is None:  # vLLM's QSA switch
        return None
    ratio = _need(cfg, "indexer_compress_ratio", "QSA's compressed key cache")
    head = _need(cfg, "indexer_head_dim", "QSA's key caches")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    return Indexed(head, ratio, isinstance(rope, dict) and rope.get("mrope_section") is not None)


def _short_conv(cfg: dict[str, Any], layers: int) -> ShortConv | None:
    """Qwen4-Exp's PLE short-conv state, one per ``ple_layer_ids`` layer."""
    ids = cfg.get("ple_layer_ids")
    if not _mtype(cfg).startswith("qwen4_exp") or not isinstance(ids, list) or not ids:
        return None
    kernel = _int(cfg, "ple_conv_kernel_size", 4, lo=1) or 4  # the config class's defaults
    width = (_int(cfg, "hc_count", 4, lo=1) or 4) * _need(cfg, "hidden_size", "the PLE state")
    return ShortConv(len(set(ids)), width, (kernel - 1) * (_int(cfg, "ngram_size", 3, lo=1) or 3))


def _compressed(cfg: dict[str, Any]) -> Compressed | None:
    """DeepSeek V4's compressed attention, read from its config (None for any other model, and for
    one whose config says no compression ratios: read as the attention it describes)."""
    if is_dsv41(cfg):
        return _compressed_v41(cfg)
    if not is_dsv4(cfg):
        return None
    layers = _need(cfg, "num_hidden_layers", "the layer stack")
    ratios = tuple(dsv4_ratios(cfg, layers)[:layers])
    head, rope = _need(cfg, "head_dim", "DeepSeek V4's KV head"), _int(cfg, "qk_rope_head_dim", 64) or 0
    if rope > head:
        raise ValueError(f"qk_rope_head_dim: {rope} is more than head_dim ({head})")
    if 4 not in ratios:  # vLLM then splits its sliding-window caches by another rule: not modelled
        raise ValueError(f"{_name(cfg)}: no layer of compression ratio 4; its cache layout is not modelled")
    index = _int(cfg, "index_head_dim", 128, lo=1) or 128
    return Compressed(ratios, head, rope, index, _int(cfg, "sliding_window", 128, lo=1) or 128)


def _compressed_v41(cfg: dict[str, Any]) -> Compressed:
    """DeepSeek V4.1's compressed attention: every layer's sliding window, the compressed caches on
    ``kv_source_layer_ids`` only (vLLM refuses compressed layers without them)."""
    layers = _need(cfg, "num_hidden_layers", "the layer stack")
    ratios = dsv41_ratios(cfg, layers)
    sources = cfg.get("kv_source_layer_ids")
    if not any(ratios):  # every layer a sliding window only: vLLM groups them by another rule
        raise ValueError(
            f"{_name(cfg)}: no compressed layer (compress_ratios); its cache layout is not modelled"
        )
    if (
        type(sources) is not list
        or not sources
        or len(set(sources)) != len(sources)
        or not all(type(i) is int and 0 <= i < layers and ratios[i] for i in sources)
    ):
        raise ValueError(
            f"kv_source_layer_ids: expected distinct compressed layers (ratio 1 or 2) below {layers}, "
            f"got {sources!r}"[:160]
        )
    head, rope = _need(cfg, "head_dim", "DeepSeek V4.1's KV head"), _int(cfg, "qk_rope_head_dim", 64) or 0
    if rope > head:
        raise ValueError(f"qk_rope_head_dim: {rope} is more than head_dim ({head})")
    index = _int(cfg, "index_head_dim", 128, lo=1) or 128
    window = _int(cfg, "sliding_window", 128, lo=1) or 128
    return Compressed(ratios, head, rope, index, window, tuple(sorted(sources)))


def _divide(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what} ({a}) does not divide by tensor parallel {b}")
    return a // b


def state_shapes(dims: StateDims, tp: int = 1, num_spec: int = 0) -> tuple[tuple[int, ...], ...]:
    """The state tensors one state layer holds per sequence on one TP rank, as vLLM's
    ``MambaStateShapeCalculator`` sizes them (conv state first, then the SSM/recurrent state);
    ``num_spec``: speculative tokens (their conv history; Mamba1 keeps none)."""
    if dims.kind == "gdn":
        conv = dims.head_k_dim * dims.num_k_heads * 2 + dims.head_dim * dims.num_heads
        return (
            (_divide(conv, tp, "GDN conv width"), dims.conv_kernel - 1 + num_spec),
            (_divide(dims.num_heads, tp, "GDN value heads"), dims.head_dim, dims.head_k_dim),
        )
    if dims.kind == "mamba2":
        groups = dims.n_groups + (0 if dims.n_groups % tp == 0 else tp - dims.n_groups)
        conv = dims.intermediate + 2 * groups * dims.state_size
        return (
            (_divide(conv, tp, "Mamba2 conv width"), dims.conv_kernel - 1 + num_spec),
            (_divide(dims.num_heads, tp, "Mamba2 heads"), dims.head_dim, dims.state_size),
        )
    if dims.kind == "mamba":
        inner = _divide(dims.intermediate, tp, "Mamba inner width")
        return ((inner, dims.conv_kernel - 1), (inner, dims.state_size))
    if dims.kind == "kda":
        conv = dims.num_heads * dims.head_dim + 2 * dims.num_k_heads * dims.head_k_dim
        return (
            (_divide(conv, tp, "KDA conv width"), dims.conv_kernel - 1 + num_spec),
            (_divide(dims.num_heads, tp, "KDA heads"), dims.head_dim, dims.head_dim),
        )
    if dims.kind == "short_conv":
        return ((_divide(dims.intermediate, tp, "short convolution width"), dims.conv_kernel - 1 + num_spec),)
    return ((_divide(dims.num_heads, tp, "linear-attention heads"), dims.head_dim, dims.head_dim),)
