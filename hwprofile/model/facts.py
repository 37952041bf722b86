"""What hwprofile knows about a model (:class:`ModelFacts`), wherever it came from, and the weight
arithmetic it shares with the planner (bytes per dtype, embeddings, checkpoint size at a bit width).

Pure: no files, no imports beyond the standard library.
"""

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .tensor import QuantGrid
    from .tokenizer_check import TokenizerFacts

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


class ModelFacts(NamedTuple):
    name: str
    source: str  # "dir", "hf-cache", "hub" (config and file list from the Hub) or "catalog"
    path: str | None
    architecture: str | None
    model_type: str | None
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    dtype: str
    tie_word_embeddings: bool
    sliding_window: int | None
    sliding_layers: int  # layers with a sliding window (the rest are full attention)
    quant_method: str | None
    quant_bits: int | None
    params: int  # estimated from the architecture
    weights_bytes: int  # on-disk checkpoint size where known, else estimated from params and bits
    weights_bytes_source: str  # "safetensors index", "safetensors files", "estimate"
    mtp_layers: int  # multi-token-prediction heads shipped with the model (usable as speculator)
    quantized_variants: dict[int, str]  # catalog: bits → checkpoint name
    # architecture facts (hwprofile.model.arch); defaults describe a dense model with ordinary attention
    active_params: int = 0  # weights read per decoded token (MoE: routed experts only); 0 = params
    num_experts: int = 0  # MoE: routed experts per MoE layer
    experts_per_token: int = 0  # MoE: experts each token is routed to
    moe_intermediate_size: int = 0  # MoE: one expert's intermediate size (vLLM's fused-MoE N before TP)
    kv_lora_rank: int = 0  # MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer
    qk_rope_head_dim: int = 0
    # where it came from (hwprofile.model.resolve): the commit of a Hub or cache model, and a sentence
    revision: str | None = None
    origin: str = ""
    # the tokenizer's facts (model.tokenizer_check.TokenizerFacts), or why none: read by the pipeline
    # only when a draft is planned beside the model, so that the planner compares without reading
    tokenizer: "TokenizerFacts | str | None" = None
    # parts of weights_bytes vLLM loads only sometimes (hwprofile.model.weights, estimated even where
    # weights_bytes is the checkpoint's own size): the vision and audio towers (not with
    # --language-model-only) and the MTP layers (only with MTP speculation: the target model skips
    # the "mtp." weights)
    vision_bytes: int = 0
    mtp_bytes: int = 0
    # weights vLLM keeps in pinned host memory rather than on the GPUs, per instance (DeepSeek V4.1's
    # engram tables: EngramConfig.cpu_offload, its default); not in weights_bytes
    host_bytes: int = 0
    # of weights_bytes: the tensors every tensor-parallel rank holds whole (MLA's down-projections,
    # routers, sparse-attention indexers: vLLM's ReplicatedLinear), estimated as the parts above
    replicated_bytes: int = 0
    # of weights_bytes: the routed experts vLLM's Mxfp4MoEMethod serves (gpt-oss, DeepSeek V4's fp4
    # experts), whose per-rank shapes it pads to its kernel's tile; and that tile (intermediate, hidden),
    # set by the plan for the GPU it plans on (hwprofile.plan.loaded.expert_tile): (1, 1) = unpadded
    mxfp4_expert_bytes: int = 0
    expert_tile: tuple[int, int] = (1, 1)
    # bytes that kernel's weight processing adds beside the checkpoint's, all ranks together (the OAI
    # Triton kernels: the experts' biases in fp32, and before vLLM 0.25 the block scales swizzled beside
    # the checkpoint's), set with the tile (hwprofile.plan.loaded.expert_tile)
    expert_kernel_bytes: int = 0
    # of mtp_bytes: the MTP layers' own such experts (DeepSeek V4's MTP block is a decoder layer, same
    # quantization), padded alike where MTP speculation loads them (hwprofile.plan.loaded.as_loaded)
    mtp_mxfp4_expert_bytes: int = 0
    # a quantized checkpoint's FP8 blocks or weight groups and the MLP widths tensor parallelism splits
    # under them (hwprofile.model.tensor.QuantGrid): a TP degree that splits a block or group vLLM refuses
    quant_grid: "QuantGrid | None" = None
    # the layer stack (hwprofile.model.layers.LayerStack): each layer's mixer and MLP, each attention
    # kind's shape, the recurrent state's dimensions; None where not read (catalog entries)
    stack: Any = None  # LayerStack | None once plan/ narrows it (plan/memory, engine, gpu, cpu, candidates)

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def bits(self) -> int:
        return self.quant_bits or 8 * min(self.dtype_bytes, 2)

    def weights_bytes_at_bits(self, bits: int) -> int:
        """Estimated checkpoint size of this model at ``bits`` per weight."""
        return weights_bytes_at(
            self.params, embed_params(self.vocab_size, self.hidden_size, self.tie_word_embeddings), bits
        )


def embed_params(vocab: int, hidden: int, tie: bool) -> int:
    """Input embedding plus LM head (one matrix when tied)."""
    return vocab * hidden * (1 if tie else 2)


def weights_bytes_at(params: int, embed: int, bits: int) -> int:
    """Checkpoint size at ``bits`` per weight. Quantized checkpoints keep embeddings and the LM head
    in 16 bits and add ~4 % for group scales and zero points (group size 128)."""
    if bits >= 16:
        return params * 2
    body = params - embed
    return int(body * bits / 8 * 1.04) + embed * 2
