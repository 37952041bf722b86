"""The sections of settings the planner reads: ``engine``, ``layout``, ``speculative``, ``memory``,
``server`` and ``cpu``. Each field is one setting's declaration and its one default (sizes in bytes)."""

from __future__ import annotations

from typing import Literal

from ..release import first_with
from .fields import HOST_ADDRESS
from .section import Section, section, setting

KTable = tuple[tuple[int, int | None, int], ...]  # speculative.by_batch_size: (lo, hi or None, k) rows

KV_CACHE_DTYPES = ("auto", "fp8_if_supported", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATIONS = (
    "auto",
    "none",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "fp8",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "mxfp4",
)
ATTENTION_BACKENDS = ("auto", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
SPEC_METHODS = ("auto", "none", "draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix")
LAYOUTS = ("auto", "single", "tensor_parallel", "numa_pairs", "replicas")
SHAPES = ("auto", "servers", "data_parallel")
FRONTS = ("auto", "router", "nginx")
MULTINODE_BACKENDS = ("mp", "ray")
OBJECTIVES = ("throughput", "latency")
BATCHING = ("predicted", "configured")

MiB = 2**20
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_CPU_LIST = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"
# VLLM_CPU_OMP_THREADS_BIND as vllm/utils/ompmultiprocessing.py reads it: one CPU list per rank
OMP_BIND = rf"auto|nobind|{_CPU_LIST}(?:\|{_CPU_LIST})*"


@section
class Engine(Section):
    """``engine.*``: vLLM's engine arguments as the profile asks for them (the planner may lower some to fit)."""

    gpu_memory_utilization: float = setting(
        "float", "share of each GPU's TOTAL memory for the instance", 0.05, 0.99, default=0.90
    )
    max_model_len: int = setting(
        "int", "context length (prompt + output) per request", 16, 10_485_760, default=8192
    )
    min_model_len: int = setting(
        "int", "shortest context the planner may fall back to before refusing", 16, 10_485_760, default=2048
    )
    max_num_seqs: int = setting("int", "concurrent sequences per instance", 1, 65_536, default=256)
    max_num_batched_tokens: int = setting(
        "int", "tokens per scheduler step (prefill chunk budget)", 16, 1_048_576, default=8192
    )
    kv_cache_dtype: str = setting("choice", "KV cache element type", choices=KV_CACHE_DTYPES, default="auto")
    quantization: str = setting(
        "choice",
        "weight quantization; auto = what the checkpoint says",
        choices=QUANTIZATIONS,
        default="auto",
    )
    weights_bits: int | Literal["auto"] = setting(
        "int_or_auto", "plan a checkpoint of this many bits per weight (4, 8, 16)", 4, 16, default="auto"
    )
    dtype: str = setting(
        "choice", "activation dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto"
    )
    enforce_eager: bool = setting("bool", "no CUDA graphs and no torch.compile", default=False)
    enable_prefix_caching: bool = setting("bool", "reuse KV blocks of shared prompt prefixes", default=True)
    enable_chunked_prefill: bool = setting(
        "bool", "split long prefills into max_num_batched_tokens chunks", default=True
    )
    language_model_only: str = setting(
        "choice",
        f"text part only (--language-model-only, {first_with('--language-model-only')}+): no vision tower; "
        "auto = on where the model has one "
        "(hwprofile plans no image inputs)",
        choices=("auto", "on", "off"),
        default="auto",
    )
    mamba_ssm_cache_dtype: str = setting(
        "choice",
        "a hybrid's SSM state dtype (--mamba-ssm-cache-dtype); auto = the model's, float16 where that "
        "keeps more sequences resident",
        choices=("auto", "float32", "float16", "bfloat16"),
        default="auto",
    )
    attention_backend: str = setting(
        "choice",
        f"vLLM's attention backend (--attention-backend, {first_with('--attention-backend')}+); auto = vLLM's "
        "own pick for the GPU, head size and KV dtype (plan/attention.py), not rendered",
        choices=ATTENTION_BACKENDS,
        default="auto",
    )


@section
class Layout(Section):
    """``layout.*``: how the GPUs are split into instances."""

    strategy: str = setting("choice", "how GPUs are split into instances", choices=LAYOUTS, default="auto")
    tensor_parallel_size: int | Literal["auto"] = setting(
        "int_or_auto", "GPUs per instance (tensor parallel)", 1, 64, default="auto"
    )
    pipeline_parallel_size: int = setting("int", "pipeline stages per instance", 1, 64, default=1)
    max_pcie_tensor_parallel: int = setting(
        "int", "largest TP group without NVLink (vLLM's custom all-reduce stops past 2)", 1, 64, default=2
    )
    replicas: int | Literal["auto"] = setting(
        "int_or_auto", "independent instances (data-parallel replicas)", 1, 64, default="auto"
    )
    numa_bind: bool = setting(
        "bool", "bind each instance's CPUs and memory to its GPUs' NUMA node", default=True
    )
    shape: str = setting(
        "choice",
        "several GPU groups as separate servers (fault isolation; one URL through nginx) or as one "
        "data-parallel vLLM server (one URL, vLLM balances); auto decides by what the release and plan allow",
        choices=SHAPES,
        default="auto",
    )
    endpoint_port: int = setting(
        "int",
        "the one port clients use in front of separate servers (nginx: render --format nginx)",
        1,
        65_535,
        default=8080,
    )
    front: str = setting(
        "choice",
        "what serves the one port in front of separate servers: vLLM's own router (pip install vllm-router; "
        "cache-aware, started and supervised by hwprofile), nginx (the operator's, render --format nginx), or "
        "auto (the router where it is installed, else nginx)",
        choices=FRONTS,
        default="auto",
    )
    nodes: int | Literal["auto"] = setting(
        "int_or_auto",
        "hosts one model runs over (with several --from snapshots): auto = the fewest that fit",
        1,
        64,
        default="auto",
    )
    master_addr: str | None = setting(
        "str",
        "address the other nodes reach node 0 at (default: node 0's address in the inventory)",
        nullable=True,
        default=None,
        pattern=HOST_ADDRESS,
        pattern_doc="a host name or an IP address",
    )
    master_port: int = setting("int", "node 0's port for the group's rendezvous", 1024, 65_535, default=29501)
    internode_gbps: float = setting(
        "float",
        "the link between nodes, Gb/s (100: 100 GbE or InfiniBand EDR; 25, 200, 400 are common)",
        1,
        3200,
        default=100.0,
    )
    internode_latency_us: float = setting(
        "float",
        "one message's latency across the link between nodes, µs (typical: InfiniBand 2-5, RoCE 5-10, "
        "TCP over Ethernet 20-50)",
        0.1,
        10_000,
        default=20.0,
    )
    multinode_backend: str = setting(
        "choice",
        f"how nodes form one vLLM: mp (--nnodes, --headless workers, {first_with('--nnodes')}+) or ray "
        "(a Ray cluster)",
        choices=MULTINODE_BACKENDS,
        default="mp",
    )
    objective: str = setting(
        "choice",
        "what the predicted choice of layout maximises: throughput (the most output tokens/s within "
        "the TTFT and TPOT targets) or latency (the lowest TPOT at the workload)",
        choices=OBJECTIVES,
        default="throughput",
    )
    batching: str = setting(
        "choice",
        "who sets max_num_seqs and max_num_batched_tokens: predicted (the candidate batching the "
        "objective prefers, where neither value was set by an operator's file, --set or the environment) or "
        "configured (the profile's values as they are)",
        choices=BATCHING,
        default="predicted",
    )
    ttft_target_ms: float = setting(
        "float",
        "time-to-first-token target of the throughput objective, ms (the seeds: 500)",
        1,
        600_000,
        default=500.0,
    )
    tpot_target_ms: float = setting(
        "float",
        "time-per-output-token target of the throughput objective, ms (the seeds: 120)",
        0.1,
        60_000,
        default=120.0,
    )
    workload_input_len: int = setting(
        "int",
        "prompt tokens per request of the workload the layouts are predicted at",
        1,
        10_485_760,
        default=512,
    )
    workload_output_len: int = setting(
        "int",
        "output tokens per request of the workload the layouts are predicted at",
        1,
        10_485_760,
        default=256,
    )
    workload_concurrency: int = setting(
        "int",
        "requests in flight on the host in the workload the layouts are predicted at",
        1,
        1_048_576,
        default=16,
    )


@section
class Speculative(Section):
    """``speculative.*``: speculative decoding."""

    method: str = setting("choice", "speculative decoding method", choices=SPEC_METHODS, default="auto")
    draft: str | None = setting(
        "str",
        "draft model: a local directory, a Hugging Face name, or a catalog name",
        nullable=True,
        default=None,
    )
    draft_params_b: float = setting(
        "float", "preferred draft size in billions of parameters (catalog pick)", 0.01, 100, default=1.5
    )
    num_speculative_tokens: int = setting("int", "tokens proposed per step (k)", 1, 16, default=5)
    by_batch_size: KTable | None = setting(
        "k_table",
        "k by running batch size: [[lo, hi, k], ...] (hi null = no limit)",
        nullable=True,
        default=None,
    )
    prompt_lookup_max: int = setting("int", "ngram: longest n-gram to match", 1, 64, default=4)
    prompt_lookup_min: int = setting("int", "ngram: shortest n-gram to match", 1, 64, default=2)
    assumed_acceptance: float = setting(
        "float",
        "per-token acceptance of speculation (a bench's measured one replaces the default)",
        0.0,
        0.999,
        default=0.6,
    )


@section
class Memory(Section):
    """``memory.*``: the memory model's per-GPU overheads."""

    non_torch_bytes: int = setting(
        "size",
        "per-GPU memory outside PyTorch that vLLM's profile counts (cuBLAS, kernel modules; the CUDA "
        "context is made before its baseline, outside gpu_memory_utilization)",
        default=128 * MiB,
    )
    collective_bytes: int = setting(
        "size", "more of it where tensor parallel > 1 (NCCL and custom all-reduce buffers)", default=448 * MiB
    )
    cuda_graph_bytes: int = setting(
        "size",
        "per-GPU memory for captured CUDA graphs, taken from the KV cache where vLLM does (0.20 on; "
        "0 when eager)",
        default=512 * MiB,
    )
    margin_bytes: int = setting(
        "size",
        "per-GPU margin taken off the KV cache estimate (vLLM's own accounting keeps none)",
        default=256 * MiB,
    )
    activation_factor: float = setting(
        "float", "multiplier on the estimated activation peak", 0.1, 10, default=1.0
    )


@section
class Server(Section):
    """``server.*``: each instance's OpenAI-compatible server."""

    host: str = setting(
        "str",
        "address to bind (default loopback)",
        default="127.0.0.1",
        pattern=r"\S+",
        pattern_doc="an address or host name without spaces (0.0.0.0 for every interface)",
    )
    port: int = setting("int", "first instance's port; later instances count up", 1, 65_535, default=8000)
    served_model_name: str | None = setting("str", "model name clients ask for", nullable=True, default=None)
    api_key_env: str | None = setting(
        "str",
        "environment variable holding the API key (never on argv)",
        nullable=True,
        default=None,
        pattern=ENV_NAME,
        pattern_doc="an environment variable name: letters, digits and _, not starting with a digit",
    )
    shutdown_timeout: int = setting(
        "int", "seconds vLLM drains in-flight requests on SIGTERM", 0, 3600, default=10
    )
    vllm_command: str | None = setting(
        "str", "the vllm executable (default: next to this Python, else on PATH)", nullable=True, default=None
    )
    user: str | None = setting(
        "str", "systemd unit user (default: a dynamic user)", nullable=True, default=None
    )
    metrics: bool = setting("bool", "keep vLLM's /metrics series (hwprofile watches them)", default=True)
    extra_args: tuple[str, ...] = setting(
        "str_list", "extra vLLM flags appended as given (they bypass the plan: use sparingly)", default=()
    )


@section
class Cpu(Section):
    """``cpu.*``: vLLM's CPU backend."""

    kv_cache_space_gib: float = setting(
        "float", "KV cache size on the CPU backend (VLLM_CPU_KVCACHE_SPACE)", 0.01, 4096, default=4.0
    )
    omp_threads_bind: str = setting(
        "str",
        "VLLM_CPU_OMP_THREADS_BIND: the CPUs each rank's OpenMP threads take (auto: vLLM's own choice)",
        default="auto",
        pattern=OMP_BIND,
        pattern_doc="auto, nobind, or a CPU list per rank separated by | (e.g. 0-15 or 0-15|16-31)",
    )
