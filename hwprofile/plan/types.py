"""The plan as frozen, typed data (contract ``hwprofile.plan/1``).

The planner builds a :class:`Plan`; :meth:`Plan.to_json` gives exactly the JSON document of the
contract (``schemas/hwprofile.plan-1.schema.json``: same keys, same order, same values), and
:meth:`Plan.from_json` reads such a document back (a detached launch stores the plan as JSON).

Sequences are tuples and every class is frozen: a changed instance is a new one
(``dataclasses.replace``). A key the contract leaves out in some plans (the CPU instance has no
``gpu_uuids``; the speculative ``prompt_lookup_*`` exist for ngram only; the estimate's figures
exist where the datasheet has a bandwidth) is :data:`ABSENT` here, and absent from the JSON.
The top-level ``supervise``, ``logs``, ``watch`` and ``degrade`` are those sections of the typed
settings (:mod:`hwprofile.config.settings`), every setting in them, each at its value or default.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, TypeAlias, TypeVar

from ..config.settings import Degrade, Logs, Section, Supervise, Watch
from ..record import record


class Absent(enum.Enum):
    """The value of a field whose key is not in the JSON document: one member, :data:`ABSENT`, false
    in a test of truth; a field that may be absent says so in its type (``int | AbsentT``), so the
    type checker sees every read that must test for it (``x is ABSENT``)."""

    ABSENT = "ABSENT"

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> Literal[False]:
        return False


ABSENT: Final = Absent.ABSENT
AbsentT: TypeAlias = Literal[Absent.ABSENT]

T = TypeVar("T", bound="_Json")


def _dump(v: object) -> object:
    if isinstance(v, _Json | Section):
        return v.to_json()
    if isinstance(v, (list, tuple)):
        return [_dump(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _dump(x) for k, x in v.items()}
    return v


def _freeze(v: Any) -> Any:
    """JSON lists as tuples, all the way down (JSON objects stay dicts)."""
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Mapping):
        return {k: _freeze(x) for k, x in v.items()}
    return v


class _Json:
    """to_json/from_json by field order; fields named in ``_nested`` hold one of these classes or a
    section of settings (or a tuple of them, or None); list-valued fields become tuples. Every
    subclass is a :func:`~.record.record`: frozen, compared and hashed by its fields' values."""

    _nested: ClassVar[dict[str, type[_Json] | type[Section]]] = {}
    _mappings: ClassVar[frozenset[str]] = frozenset()
    _raw: ClassVar[frozenset[str]] = frozenset()
    # declared, not set: every subclass is a dataclass, and this says so to mypy
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is ABSENT:
                continue
            out[f.name] = _dump(v)
        return out

    @classmethod
    def from_json(cls: type[T], doc: Mapping[str, Any]) -> T:
        if not isinstance(doc, Mapping):
            raise TypeError(f"{cls.__name__}: expected an object, got {type(doc).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(doc) - set(names))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}")
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in doc:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"{cls.__name__}: missing key {f.name!r}")
                continue
            v = doc[f.name]
            sub = cls._nested.get(f.name)
            if sub is not None and v is not None and issubclass(sub, Section):
                v = sub.from_json(v, f.name)  # a section of settings: each value checked, named
            elif sub is not None and v is not None:
                v = tuple(sub.from_json(x) for x in v) if isinstance(v, (list, tuple)) else sub.from_json(v)
            elif f.name in cls._mappings:
                v = dict(v)
            elif f.name in cls._raw:
                pass
            else:
                v = _freeze(v)
            kw[f.name] = v
        return cls(**kw)


@record
class Reason(_Json):
    """Why one planned value is what it is, and which layer set it (``planner`` when none)."""

    key: str
    value: Any
    reason: str
    source: str
    _raw: ClassVar[frozenset[str]] = frozenset({"value"})


@record
class HostSummary(_Json):
    hostname: str | None
    gpus: int
    vllm_version: str | None


@record
class ModelSummary(_Json):
    """A model's facts as the plan shows them (``model`` and ``draft``)."""

    name: str
    source: str | None
    path: str | None
    architecture: str | None
    params: int | None
    weights_bytes: int | None
    weights_bytes_source: str | None
    bits: int | None
    quantization: str | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    sliding_window: int | None
    sliding_layers: int | None
    revision: str | AbsentT | None = ABSENT  # the commit, for a model from the Hub or the Hugging Face cache
    origin: str | AbsentT = ABSENT  # where the facts came from: the Hub, the cache, the catalog, a directory

    # the facts a served step's cost follows: a measurement of one model (``hwprofile bench``) holds for
    # another only where they agree (pipeline.calibration_from_bench, plan._own_calibration)
    COST_FACTS: ClassVar[tuple[str, ...]] = (
        "architecture",
        "params",
        "bits",
        "quantization",
        "layers",
        "kv_heads",
        "head_dim",
        "vocab_size",
        "sliding_window",
        "sliding_layers",
    )

    def cost_facts(self) -> dict[str, Any]:
        """{fact: value} of :attr:`COST_FACTS`: what a bench records of the model it measured."""
        return {k: getattr(self, k) for k in self.COST_FACTS}


@record
class ServerSettings(_Json):
    host: str
    port: int
    served_model_name: str | None
    api_key_env: str | None
    shutdown_timeout: int
    vllm_command: str | None
    user: str | None
    metrics: bool
    extra_args: tuple[str, ...]


@record
class EngineSettings(_Json):
    """vLLM engine arguments; ``gpu_memory_utilization`` is None and ``kv_cache_memory_bytes`` is set
    on the CPU instance only."""

    gpu_memory_utilization: float | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    quantization: str | None
    dtype: str
    enforce_eager: bool
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    kv_cache_memory_bytes: int | AbsentT = ABSENT
    # --language-model-only: the vision tower not loaded (plan/loaded.py); absent for a model without one
    language_model_only: bool | AbsentT = ABSENT
    # a hybrid (recurrent-state layers): --mamba-ssm-cache-dtype and --mamba-cache-mode as the plan's
    # accounting assumes them (plan/engine.py choose_ssm_dtype; align with prefix caching, else none)
    mamba_ssm_cache_dtype: str | AbsentT = ABSENT
    mamba_cache_mode: str | AbsentT = ABSENT
    # --attention-backend where engine.attention_backend sets one (absent: vLLM's own pick, plan/attention.py)
    attention_backend: str | AbsentT = ABSENT

    def to_json(self) -> dict[str, Any]:
        # The contract's order puts kv_cache_memory_bytes right after kv_cache_dtype.
        out: dict[str, Any] = {}
        for k, v in super().to_json().items():
            if k == "kv_cache_memory_bytes":
                continue
            out[k] = v
            if k == "kv_cache_dtype" and self.kv_cache_memory_bytes is not ABSENT:
                out["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        return out


@record
class SpeculativeConfig(_Json):
    """``num_speculative_tokens_per_batch_size``: ``((lo, hi or None, k), ...)``."""

    method: str
    model: str | None
    num_speculative_tokens: int
    draft_tensor_parallel_size: int | AbsentT = ABSENT
    prompt_lookup_max: int | AbsentT = ABSENT
    prompt_lookup_min: int | AbsentT = ABSENT
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int | None, int], ...] | AbsentT = ABSENT
    use_heterogeneous_vocab: bool | AbsentT = ABSENT  # draft ids mapped through shared tokens (vLLM 0.25+)


@record
class MemoryFit(_Json):
    """The instance's memory breakdown per GPU (the CPU instance: its RAM). ``vllm_logged_kv_tokens``:
    the KV cache size vLLM will log, where hwprofile can say it (the CPU instance; a GPU instance of a
    sliding-window model); None with a draft."""

    budget_bytes: int
    weights_bytes: int
    draft_weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_target: int
    kv_bytes_per_token_draft: int
    kv_tokens: int
    block_size: int
    kv_bytes_per_max_len_request: int
    vllm_logged_kv_tokens: int | AbsentT | None = ABSENT
    # a hybrid model (recurrent-state layers): the state one running sequence holds per GPU (its
    # pages in every state group), and the sequences whose state the pool holds at once
    state_bytes_per_sequence: int | AbsentT = ABSENT
    state_sequences: int | AbsentT = ABSENT


@record
class Estimate(_Json):
    """The batch-1 decode ceiling; only ``note`` on the CPU instance and where the datasheet has no
    bandwidth figure."""

    gpu_datasheet: str | AbsentT | None = ABSENT
    memory_bandwidth_gbs: float | AbsentT | None = ABSENT
    note: str | AbsentT = ABSENT
    bytes_read_per_token_per_gpu: int | AbsentT = ABSENT
    decode_tok_s_ceiling_batch1: float | AbsentT = ABSENT
    assumed_acceptance: float | AbsentT = ABSENT
    acceptance_source: str | AbsentT = ABSENT  # measured (the calibration) or the setting
    expected_tokens_per_step: float | AbsentT = ABSENT
    decode_tok_s_ceiling_batch1_speculative: float | AbsentT = ABSENT
    basis: str | AbsentT = ABSENT
    # a group over several nodes (plan/nodes.py): what crosses the link between them per token
    nodes_parallel: str | AbsentT = ABSENT  # pipeline, tensor or data (how the group splits over the nodes)
    internode_gbps: float | AbsentT = ABSENT
    internode_latency_us: float | AbsentT = ABSENT
    internode_bytes_per_token: int | AbsentT = ABSENT
    internode_ms_per_token: float | AbsentT = ABSENT
    decode_tok_s_ceiling_batch1_group: float | AbsentT = ABSENT  # the whole group's, link included
    internode_basis: str | AbsentT = ABSENT


@record
class InstancePrediction(_Json):
    """The performance model's figures for this instance at the plan's workload (plan/predict.py):
    ``output_tokens_per_s`` of this instance (all its ranks), with its share of the workload's
    requests; ``terms``: each part of the figures and its source (datasheet, snapshot, model,
    calibration)."""

    workload: Mapping[str, int]
    concurrency: int  # this instance's requests in flight
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    source: str  # "datasheet", or the calibration file it came from
    terms: tuple[Mapping[str, Any], ...]
    # plan/simulate.py: the workload through a simulation of vLLM's scheduler (issue 32); None: not run
    simulated: Mapping[str, Any] | None = None


@record
class InstancePlan(_Json):
    """One vLLM server: where it runs (``device`` ``cuda`` or ``cpu``) and with what."""

    name: str
    device: str
    gpus: tuple[int, ...]
    gpu_name: str | None
    numa_node: int | None
    cpus: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    server: ServerSettings
    engine: EngineSettings
    speculative: SpeculativeConfig | None
    memory: MemoryFit
    estimate: Estimate
    gpu_uuids: tuple[str | None, ...] | AbsentT = ABSENT
    gpu_minors: tuple[int | None, ...] | AbsentT = ABSENT
    gpu_numa_nodes: tuple[int | None, ...] | AbsentT = ABSENT
    # data-parallel ranks behind this one API server (absent: 1); each rank has tensor_parallel_size
    # GPUs, in the order of ``gpus``, and its own scheduler with these engine settings
    data_parallel_size: int | AbsentT = ABSENT
    # one of several hosts running one vLLM (absent: one host): this instance is node ``node_rank``
    # of ``nnodes``, at ``node_address``; node 0 has the API server, the others run headless
    node_rank: int | AbsentT = ABSENT
    nnodes: int | AbsentT = ABSENT
    node_address: str | AbsentT = ABSENT
    master_addr: str | AbsentT = ABSENT
    master_port: int | AbsentT = ABSENT
    node_backend: str | AbsentT = (
        ABSENT  # how the nodes form one vLLM: mp (--nnodes, headless workers) or ray
    )
    # a CPU instance's VLLM_CPU_OMP_THREADS_BIND, one CPU list per rank (absent: vLLM's own "auto")
    omp_threads_bind: str | AbsentT = ABSENT
    prediction: InstancePrediction | AbsentT = (
        ABSENT  # plan/predict.py at layout.workload_*; absent: no model (CPU, no datasheet)
    )
    # the recorded interconnect check's decision for this TP group (plan/interconnect.py); absent:
    # TP 1, or no check recorded on this host
    interconnect: Mapping[str, Any] | AbsentT = ABSENT

    @property
    def ranks(self) -> int:
        return 1 if self.data_parallel_size is ABSENT else int(self.data_parallel_size)

    @property
    def node(self) -> int:
        """The node this instance runs on (0 on a one-host plan)."""
        return 0 if self.node_rank is ABSENT else int(self.node_rank)

    @property
    def headless(self) -> bool:
        """A worker node of a multi-node group: no API server of its own."""
        return self.node > 0

    _nested: ClassVar[dict[str, type[_Json] | type[Section]]] = {
        "server": ServerSettings,
        "engine": EngineSettings,
        "speculative": SpeculativeConfig,
        "memory": MemoryFit,
        "estimate": Estimate,
        "prediction": InstancePrediction,
    }
    _ORDER: ClassVar[tuple[str, ...]] = (
        "name",
        "device",
        "gpus",
        "gpu_uuids",
        "gpu_minors",
        "gpu_name",
        "numa_node",
        "gpu_numa_nodes",
        "cpus",
        "omp_threads_bind",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "node_rank",
        "nnodes",
        "node_address",
        "master_addr",
        "master_port",
        "node_backend",
        "server",
        "engine",
        "speculative",
        "memory",
        "estimate",
        "prediction",
        "interconnect",
    )

    def to_json(self) -> dict[str, Any]:
        d = super().to_json()
        return {k: d[k] for k in self._ORDER if k in d}


@record
class Endpoint(_Json):
    """The one URL clients use for this plan, and what serves it: the one instance itself (a single
    server, or a data-parallel one: vLLM balances its ranks), or vLLM's router (started and supervised
    by hwprofile) or nginx (``hwprofile render --format nginx`` writes its configuration) in front of
    separate servers."""

    url: str
    via: str  # "vllm" (the instance's own API server), "router" (vLLM's router) or "nginx"
    instances: tuple[str, ...]
    how: str
    policy: str | AbsentT = ABSENT  # via "router": its load-balancing policy (the reason is layout.front's)


@record
class Plan(_Json):
    """The launch plan: what runs where, with a reason for every value."""

    schema: str
    profile: str
    matched_because: tuple[str, ...]
    host: HostSummary
    model: ModelSummary
    draft: ModelSummary | None
    instances: tuple[InstancePlan, ...]
    supervise: Supervise
    logs: Logs
    watch: Watch
    degrade: Degrade
    reasons: tuple[Reason, ...]
    provenance: Mapping[str, str]
    warnings: tuple[str, ...]
    endpoint: Endpoint | None = None
    # the candidates the performance model compared, per group of GPUs, and the winner (plan/candidates.py)
    prediction: Mapping[str, Any] | AbsentT = ABSENT

    _nested: ClassVar[dict[str, type[_Json] | type[Section]]] = {
        "endpoint": Endpoint,
        "host": HostSummary,
        "model": ModelSummary,
        "draft": ModelSummary,
        "instances": InstancePlan,
        "supervise": Supervise,
        "logs": Logs,
        "watch": Watch,
        "degrade": Degrade,
        "reasons": Reason,
    }
    _mappings: ClassVar[frozenset[str]] = frozenset({"provenance"})

    def instance(self, name: str) -> InstancePlan:
        """The instance called ``name`` (KeyError when there is none)."""
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(name)

    @property
    def nodes(self) -> int:
        """How many hosts this plan runs on (1 unless it is a multi-node plan)."""
        return max((inst.node for inst in self.instances), default=0) + 1

    def for_node(self, rank: int) -> Plan:
        """This plan as node ``rank`` runs it: its own instances only (a one-host plan is node 0's)."""
        mine = tuple(i for i in self.instances if i.node == rank)
        if not mine:
            raise KeyError(f"node {rank}: this plan runs on {self.nodes} node(s)")
        return dataclasses.replace(self, instances=mine)


__all__ = [
    "ABSENT",
    "Absent",
    "AbsentT",
    "Endpoint",
    "EngineSettings",
    "Estimate",
    "HostSummary",
    "InstancePlan",
    "InstancePrediction",
    "MemoryFit",
    "ModelSummary",
    "Plan",
    "Reason",
    "ServerSettings",
    "SpeculativeConfig",
]
