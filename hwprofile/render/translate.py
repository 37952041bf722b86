"""Translate one planned instance into the arguments and environment of a given vLLM release.

Every decision that depends on the release lives here; each setting that had to be dropped or
translated becomes a warning. The result is plain data the templates only format. Arguments are an
argv list; nothing here builds a shell string, and the API key is carried by reference only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import RefusedError
from ..plan.types import ABSENT, EngineSettings, InstancePlan, Plan, SpeculativeConfig
from ..release import Release, first_speculative, first_with, first_with_all

Pair = tuple[str, Any]  # (flag, value); value None = a switch, list = several values


class Rendered(NamedTuple):
    name: str
    vllm_version: str  # the target release
    flag_table: str  # the release whose flag table was used
    prefix: list[str]  # NUMA wrapper in front of vLLM (may be empty)
    command: list[str]  # [vllm, "serve", model]
    args: list[Pair]  # vLLM's own flags, in order
    env: dict[str, str]  # environment for the instance (no secret values)
    secrets: dict[str, str]  # variable vLLM reads → variable of hwprofile's environment holding it
    numa_node: int | None
    cpus: str | None
    gpus: list[int]
    device: str
    stop_timeout_s: int  # how long a supervisor waits after SIGTERM before SIGKILL
    warnings: list[str]

    @property
    def argv(self) -> list[str]:
        return [*self.prefix, *self.command, *flatten(self.args)]

    def config(self) -> dict[str, Any]:
        """The same flags as a vLLM ``--config`` YAML mapping (keys = flag names without dashes)."""
        out: dict[str, Any] = {}
        for flag, value in self.args:
            key = flag.lstrip("-")
            if flag == "--speculative-config":
                value = json.loads(value)
            out[key] = True if value is None else value
        return out


def flatten(args: list[Pair]) -> list[str]:
    out: list[str] = []
    for flag, value in args:
        out.append(flag)
        if value is None:
            continue
        if isinstance(value, list):
            out.extend(str(v) for v in value)
        else:
            out.append(str(value))
    return out


class Unrenderable(RefusedError):
    """A planned instance this release cannot run as planned (exit 1, with the fix)."""


RAY_PORT = 6379  # `ray start --head`'s default


def _nodes(inst: InstancePlan, rel: Release, warnings: list[str]) -> list[Pair]:
    """The flags that make this node's vLLM one of the group (vLLM's own multi-node launch).

    Data parallel across nodes: ``--data-parallel-size N --data-parallel-size-local 1
    --data-parallel-address A --data-parallel-rpc-port P`` and, on the other nodes, ``--headless
    --data-parallel-start-rank K`` (0.9.2+). Tensor or pipeline parallel across nodes (the ``mp``
    backend, 0.12+): ``--nnodes N --node-rank K --master-addr A --master-port P``, ``--headless`` on
    the other nodes. The Ray backend (``layout.multinode_backend=ray``, or a release without
    ``--nnodes``): ``--distributed-executor-backend ray`` on node 0, the Ray cluster started first
    (the commands are said; hwprofile does not run Ray)."""
    if inst.nnodes is ABSENT or inst.master_addr is ABSENT or inst.master_port is ABSENT:
        raise ValueError(f"{inst.name}: not one of a multi-node group (no nnodes, master_addr, master_port)")
    k, n = inst.node, inst.nnodes
    addr, port = inst.master_addr, inst.master_port
    out: list[Pair] = []
    if inst.ranks > 1:  # one data-parallel rank per node
        return _nodes_data_parallel(inst, rel, addr, port)
    backend = str(inst.node_backend) if inst.node_backend is not ABSENT else "mp"
    if backend == "mp" and all(
        rel.has(f) for f in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
    ):
        out += [("--nnodes", n), ("--node-rank", k), ("--master-addr", addr), ("--master-port", port)]
        if k:
            out.append(("--headless", None))
        return out
    return _nodes_ray(inst, rel, backend, addr, warnings)


def _nodes_data_parallel(inst: InstancePlan, rel: Release, addr: str, port: int) -> list[Pair]:
    """Data parallel across nodes, one rank per node: the flags of node ``inst.node``."""
    need = (
        "--data-parallel-size",
        "--data-parallel-size-local",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--headless",
        "--data-parallel-start-rank",
    )
    missing = [f for f in need if not rel.has(f)]
    if missing:
        raise Unrenderable(
            f"{inst.name}: vLLM {rel.table} has no {', '.join(missing)} ({first_with_all(need)}+): "
            "data parallel across nodes needs them; plan each node alone instead"
        )
    out: list[Pair] = [
        ("--data-parallel-size", inst.ranks),
        ("--data-parallel-size-local", 1),
        ("--data-parallel-address", addr),
        ("--data-parallel-rpc-port", port),
    ]
    if inst.node:
        out += [("--headless", None), ("--data-parallel-start-rank", inst.node)]
    return out


def _nodes_ray(inst: InstancePlan, rel: Release, backend: str, addr: str, warnings: list[str]) -> list[Pair]:
    """One model over several nodes on a Ray cluster: node 0's flag and the cluster's commands said
    (any other node runs no vLLM: Unrenderable, with the command it runs instead)."""
    k = inst.node
    if not rel.has("--distributed-executor-backend"):
        raise Unrenderable(f"{inst.name}: vLLM {rel.table} cannot run one model over several nodes")
    why = (
        "layout.multinode_backend=ray"
        if backend == "ray"
        else f"vLLM {rel.table} has no --nnodes ({first_with('--nnodes')}+)"
    )
    if k:
        raise Unrenderable(
            f"{inst.name}: node {k} of a Ray group runs no vLLM ({why}): on this node run "
            f"`ray start --address {addr}:{RAY_PORT}`; node 0's vLLM serves the whole group"
        )
    warnings.append(
        f"{inst.name}: the Ray backend ({why}): start the cluster first — here `ray start --head "
        f"--node-ip-address {addr} --port {RAY_PORT}`, on every other node `ray start --address {addr}:{RAY_PORT}`"
        " — then only this node runs vLLM"
    )
    return [("--distributed-executor-backend", "ray")]


class Argv:
    """The one builder every emitter writes through: vLLM's flags in order, the environment, the
    NUMA wrapper in front, and what had to be dropped or translated (the warnings)."""

    def __init__(self, rel: Release) -> None:
        self.rel = rel
        self.args: list[Pair] = []
        self.env: dict[str, str] = {}
        self.prefix: list[str] = []
        self.warnings: list[str] = []

    def put(self, flag: str, value: object = None) -> None:
        """``flag`` as it is (the caller checked the release has it)."""
        self.args.append((flag, value))

    def add(self, flag: str, value: object = None, why_missing: str | None = None) -> bool:
        """``flag`` where the release has it, else a warning; whether it was emitted."""
        if self.rel.has(flag):
            self.put(flag, value)
            return True
        self.warn(
            f"{flag} does not exist in vLLM {self.rel.table}: not emitted"
            + (f" ({why_missing})" if why_missing else "")
        )
        return False

    def choice(self, flag: str, value: str, fallback: str) -> str | None:
        """``value`` where the release accepts it for ``flag`` (or says nothing of its choices)."""
        allowed = self.rel.choices(flag)
        if allowed is None or value in allowed:
            return value
        self.warn(
            f"{flag} {value} is not accepted by vLLM {self.rel.table} (accepts {', '.join(allowed)}): {fallback}"
        )
        return None

    def replace(self, flag: str, value: object) -> None:
        """The value of ``flag``, already emitted, changed in place."""
        i = next(n for n, (f, _) in enumerate(self.args) if f == flag)
        self.args[i] = (flag, value)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


class Target(NamedTuple):
    """What every emitter reads: the instance of the plan, the release, the host's numactl, and the
    speculative decision (made once: the prefill emitter needs whether the instance speculates)."""

    plan: Plan
    inst: InstancePlan
    rel: Release
    numactl: str | None
    spec_args: list[Pair]
    speculating: bool
    spec_warnings: list[str]

    @property
    def e(self) -> EngineSettings:
        return self.inst.engine

    @property
    def cuda(self) -> bool:
        return self.inst.device == "cuda"

    @property
    def multinode(self) -> bool:
        return self.inst.nnodes is not ABSENT and int(self.inst.nnodes) > 1


def emit_release_note(t: Target, out: Argv) -> None:
    if t.rel.note:
        out.warn(t.rel.note)


def emit_server(t: Target, out: Argv) -> None:
    """Where it listens, the name it serves, the model's revision."""
    srv = t.inst.server
    out.put("--host", srv.host)
    out.put("--port", srv.port)
    if srv.served_model_name:
        out.put("--served-model-name", srv.served_model_name)
    rev = t.plan.model.revision
    if not t.plan.model.path and isinstance(rev, str) and rev:
        # a model served by name: the commit that was planned, not whatever main is when vLLM starts
        out.put("--revision", rev)
        out.put("--tokenizer-revision", rev)


def emit_batching(t: Target, out: Argv) -> None:
    """Memory share, context length and the batch's bounds."""
    e = t.e
    if t.cuda and e.gpu_memory_utilization is not None:
        out.add("--gpu-memory-utilization", e.gpu_memory_utilization)
    out.add("--max-model-len", e.max_model_len)
    out.add("--max-num-seqs", e.max_num_seqs)
    out.add("--max-num-batched-tokens", e.max_num_batched_tokens)


def emit_parallel(t: Target, out: Argv) -> None:
    """Tensor, pipeline and data parallel sizes; the flags of a group over several nodes."""
    inst = t.inst
    if inst.tensor_parallel_size > 1:
        out.add("--tensor-parallel-size", inst.tensor_parallel_size)
    if inst.pipeline_parallel_size > 1:
        out.add("--pipeline-parallel-size", inst.pipeline_parallel_size)
    if inst.ranks > 1 and not t.multinode and not out.add("--data-parallel-size", inst.ranks):
        raise Unrenderable(
            f"{inst.name} is one data-parallel server of {inst.ranks} ranks, and vLLM {t.rel.table} has no "
            f"--data-parallel-size ({first_with('--data-parallel-size')}+): plan it with --set layout.shape=servers"
        )
    if t.multinode:
        out.args += _nodes(inst, t.rel, out.warnings)


def emit_dtypes(t: Target, out: Argv) -> None:
    """Weights' and KV cache's dtypes, the quantization, eager mode."""
    e = t.e
    if e.dtype and e.dtype != "auto":
        dt = out.choice("--dtype", e.dtype, "left to the model's own dtype")
        if dt:
            out.add("--dtype", dt)
    if e.kv_cache_dtype and e.kv_cache_dtype != "auto":
        kv = out.choice("--kv-cache-dtype", e.kv_cache_dtype, "KV cache stays in the model's dtype (auto)")
        if kv:
            out.add("--kv-cache-dtype", kv)
    quant = e.quantization
    if quant == "awq" and t.rel.spec_table()["awq_forces_legacy_kernel"]:
        out.warn(
            f"--quantization awq not emitted: on vLLM {t.rel.table} it forces the legacy AWQ kernel; left to "
            "vLLM's own detection, which picks the faster awq_marlin kernel where the GPU allows it"
        )
        quant = None
    if quant:
        q = out.choice(
            "--quantization", quant, "not emitted; vLLM reads the checkpoint's quantization_config itself"
        )
        if q:
            out.add("--quantization", q)
    if e.enforce_eager:
        out.add("--enforce-eager")
    if e.attention_backend is not ABSENT:  # engine.attention_backend (vLLM's own pick: nothing)
        out.add("--attention-backend", e.attention_backend, "vLLM picks its own attention backend")


def emit_hybrid(t: Target, out: Argv) -> None:
    """A hybrid model's state dtype and cache mode; the vision tower left out."""
    e = t.e
    if e.mamba_ssm_cache_dtype not in (ABSENT, "auto"):
        ssm = out.choice(
            "--mamba-ssm-cache-dtype", str(e.mamba_ssm_cache_dtype), "the model's own SSM state dtype"
        )
        if ssm:
            out.add("--mamba-ssm-cache-dtype", ssm)
    if e.mamba_cache_mode is not ABSENT and t.rel.has("--mamba-cache-mode"):
        mode = out.choice("--mamba-cache-mode", str(e.mamba_cache_mode), "vLLM's own default for it")
        if mode:
            out.add("--mamba-cache-mode", mode)
    if e.language_model_only is True:  # the plan counted no vision tower (plan/loaded.py)
        out.add("--language-model-only", None, "the vision tower will load: the plan did not count it")


def emit_speculative_notes(t: Target, out: Argv) -> None:
    """What the release changed of the planned speculation (its flags come with the devices')."""
    out.warnings += t.spec_warnings


def emit_prefill(t: Target, out: Argv) -> None:
    """Prefix caching and chunked prefill, on or said off; the batch bound chunked prefill's
    absence needs."""
    e, rel = t.e, t.rel
    chunked = bool(e.enable_chunked_prefill)
    if chunked and t.speculating and rel.spec_table()["chunked_prefill"] == "refused":
        chunked = False
        out.warn(
            f"vLLM {rel.table} refuses chunked prefill together with speculative decoding "
            "('mutually exclusive'): chunked prefill left off"
        )
        need = max(e.max_model_len, e.max_num_seqs)
        if e.max_num_batched_tokens < need:
            out.replace("--max-num-batched-tokens", need)
            out.warn(
                f"--max-num-batched-tokens raised from {e.max_num_batched_tokens} to {need}: without "
                f"chunked prefill vLLM {rel.table} needs it >= --max-model-len and >= --max-num-seqs"
            )
    for key, flag, on in (
        ("enable_prefix_caching", "--enable-prefix-caching", bool(e.enable_prefix_caching)),
        ("enable_chunked_prefill", "--enable-chunked-prefill", chunked),
    ):
        if on:
            out.add(flag)
        elif rel.has("--no-" + flag[2:]):
            out.put("--no-" + flag[2:])
        elif key == "enable_chunked_prefill" and not chunked and t.speculating:
            pass  # this release does not turn chunked prefill on by itself while speculating
        else:
            out.warn(
                f"{key}=false cannot be said to vLLM {rel.table} (no --no-{flag[2:]}); its default applies"
            )


def emit_environment(t: Target, out: Argv) -> None:
    """The environment every instance gets: no usage stats, vLLM's logging, offline local weights,
    the address other nodes reach this one at."""
    out.env.update(
        {
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CONFIGURE_LOGGING": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
    )
    if t.plan.model.source in ("dir", "hf-cache"):
        out.env["HF_HUB_OFFLINE"] = "1"  # the weights are local: never reach for the hub
    if t.multinode and t.inst.node_address is not ABSENT:
        out.env["VLLM_HOST_IP"] = str(t.inst.node_address)  # the address the other nodes reach this one at


def emit_gpu_devices(t: Target, out: Argv) -> None:
    """A GPU instance's devices: their numbering, the allocator, what the interconnect check asked
    for, the calibrated KV pool."""
    if not t.cuda:
        return
    inst, e, rel = t.inst, t.e, t.rel
    out.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering = NVML's (hwprofile's) numbering
    if e.mamba_cache_mode is not ABSENT:  # a hybrid: its prefill kernels fragment the allocator
        out.env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    known = inst.gpu_uuids or ()  # ABSENT on the CPU instance
    uuids = [u for u in known if u]  # None: unknown
    if rel.uuid_visible_devices() and uuids and len(uuids) == len(known):
        # UUIDs survive a renumbering (a GPU lost or added); vLLM maps them back to NVML indexes
        out.env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    else:
        out.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpus)
    ic = inst.interconnect or {}  # the recorded interconnect check's decision (plan/interconnect.py)
    if ic.get("nccl_p2p_disable"):
        out.env["NCCL_P2P_DISABLE"] = "1"
    if ic.get("disable_custom_all_reduce"):
        if rel.has("--disable-custom-all-reduce"):
            out.put("--disable-custom-all-reduce")
        else:
            out.warn(f"vLLM {rel.table} has no --disable-custom-all-reduce: the check asked for it")
    pinned = e.kv_cache_memory_bytes or None  # ABSENT unless supervise.pin_kv_pool pinned the pool
    if pinned and rel.has("--kv-cache-memory-bytes"):
        out.put("--kv-cache-memory-bytes", pinned)
    elif pinned:
        out.warn(
            f"vLLM {rel.table} has no --kv-cache-memory-bytes ({first_with('--kv-cache-memory-bytes')}+): "
            "the calibrated KV pool "
            f"of {pinned} bytes is not pinned; vLLM profiles it"
        )


def emit_cpu_kv(t: Target, out: Argv) -> None:
    """A CPU instance's KV cache size: the flag, or vLLM's variable in whole GiB; and its OpenMP
    binding where the plan names one (``cpu.omp_threads_bind``).

    No VLLM_CPU_OMP_THREADS_BIND of hwprofile's own: an explicit CPU list takes every listed core for
    OpenMP and leaves none for vLLM's scheduler and API processes; vLLM's own default ("auto") picks
    one thread per physical core of the node the process may use (numactl below) and reserves cores
    for them (vllm/utils/ompmultiprocessing.py). An operator's list is rendered as given."""
    if t.cuda:
        return
    if t.inst.omp_threads_bind is not ABSENT:
        out.env["VLLM_CPU_OMP_THREADS_BIND"] = str(t.inst.omp_threads_bind)
    kv_bytes = t.e.kv_cache_memory_bytes or None  # ABSENT on GPU instances
    if not kv_bytes:
        return
    if t.rel.has("--kv-cache-memory-bytes"):
        out.put("--kv-cache-memory-bytes", kv_bytes)
        return
    gib = max(1, -(-kv_bytes // 2**30))
    out.env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    if gib * 2**30 != kv_bytes:
        out.warn(
            f"vLLM {t.rel.table} sizes the CPU KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE={gib}); "
            f"the plan's {kv_bytes} bytes rounded up"
        )


def emit_speculative_args(t: Target, out: Argv) -> None:
    out.args += t.spec_args


def emit_logging(t: Target, out: Argv) -> None:
    """Keep vLLM's stats (they feed /metrics); keep health polls out of the access log."""
    if not t.inst.server.metrics:
        out.add("--disable-log-stats")
    if t.rel.has("--disable-access-log-for-endpoints"):
        out.put("--disable-access-log-for-endpoints", "/health,/metrics,/ping")


def emit_shutdown(t: Target, out: Argv) -> None:
    """How long vLLM drains on SIGTERM, where the release can."""
    timeout = t.inst.server.shutdown_timeout
    if not timeout:
        return
    if t.rel.has("--shutdown-timeout"):
        out.put("--shutdown-timeout", timeout)
    else:
        out.warn(
            f"--shutdown-timeout does not exist in vLLM {t.rel.table}: on SIGTERM it does not drain; "
            f"the supervisor escalates to SIGKILL after {timeout} s"
        )


def emit_numa(t: Target, out: Argv) -> None:
    """NUMA binding: vLLM's own flags where they exist (GPU workers), else numactl in front."""
    inst, numactl = t.inst, t.numactl
    node = inst.numa_node
    per_gpu = inst.gpu_numa_nodes or ()
    vllm_binds = t.cuda and t.rel.has("--numa-bind") and t.rel.has("--numa-bind-nodes")
    no_numactl = (
        "vLLM's --numa-bind runs workers under numactl, which is not on this host (apt-get install numactl)"
    )
    if (
        vllm_binds
        and per_gpu
        and all(n is not None for n in per_gpu)
        and (node is not None or len(set(per_gpu)) > 1)
    ):
        # one node per visible GPU, in CUDA_VISIBLE_DEVICES order: an instance that spans nodes
        # binds each rank to its own GPU's node
        out.put("--numa-bind")
        out.put("--numa-bind-nodes", list(per_gpu))
        if not numactl:
            out.warn(no_numactl)
    elif node is None:
        if per_gpu:  # the planner asked for binding (empty: binding off, or one NUMA node)
            out.warn(f"{inst.name}: NUMA node unknown or not shared by its GPUs: not bound")
    elif vllm_binds:
        out.put("--numa-bind")
        out.put("--numa-bind-nodes", [node] * len(inst.gpus))
        if not numactl:
            out.warn(no_numactl)
    elif numactl:
        out.prefix = [numactl, f"--cpunodebind={node}", f"--membind={node}", "--"]
    else:
        out.warn(f"{inst.name}: numactl not found: NUMA node {node} not bound (apt-get install numactl)")


def emit_extra_args(t: Target, out: Argv) -> None:
    """``server.extra_args``, last, as given."""
    extra = t.inst.server.extra_args
    if extra:
        out.warn(f"server.extra_args appended as given (not checked against the plan): {' '.join(extra)}")
        out.args += [(a, None) for a in extra]


# The emitters in the order their flags, variables and warnings appear: one concern each.
EMITTERS: tuple[Callable[[Target, Argv], None], ...] = (
    emit_release_note,
    emit_server,
    emit_batching,
    emit_parallel,
    emit_dtypes,
    emit_hybrid,
    emit_speculative_notes,
    emit_prefill,
    emit_environment,
    emit_gpu_devices,
    emit_cpu_kv,
    emit_speculative_args,
    emit_logging,
    emit_shutdown,
    emit_numa,
    emit_extra_args,
)


def render_instance(
    plan: Plan,
    inst: InstancePlan,
    rel: Release,
    vllm_command: str,
    numactl: str | None,
) -> Rendered:
    """``inst`` of ``plan`` as the vLLM release ``rel`` takes it: each emitter of :data:`EMITTERS`
    in turn, writing through one :class:`Argv`."""
    if rel.target is None or rel.table is None:
        raise Unrenderable(f"{inst.name}: vLLM {rel.target or 'unknown'} has no flag table to render for")
    spec_warnings: list[str] = []
    spec_args, speculating = _speculative(plan, inst, inst.engine, rel, spec_warnings)
    target = Target(plan, inst, rel, numactl, spec_args, speculating, spec_warnings)
    out = Argv(rel)
    for emit in EMITTERS:
        emit(target, out)
    srv = inst.server
    return Rendered(
        name=inst.name,
        vllm_version=rel.target,
        flag_table=rel.table,
        prefix=out.prefix,
        command=[vllm_command, "serve", plan.model.path or plan.model.name],
        args=out.args,
        env=out.env,
        secrets={"VLLM_API_KEY": srv.api_key_env} if srv.api_key_env else {},
        numa_node=inst.numa_node,
        cpus=inst.cpus,
        gpus=list(inst.gpus),
        device=inst.device,
        stop_timeout_s=srv.shutdown_timeout + 20,
        warnings=out.warnings,
    )


def _fixed_k(by_batch: Sequence[tuple[int, int | None, int]], max_seqs: int, k: int) -> int:
    """The k to run at every load where the release cannot vary it: the k of the band covering the
    most batch sizes in [1, max_num_seqs] among the bands that still speculate (k >= 2)."""
    best, width = None, 0
    for lo, hi, kk in by_batch:
        top = min(hi if hi is not None else max_seqs, max_seqs)
        if kk >= 2 and top - lo + 1 > width:
            best, width = kk, top - lo + 1
    return best if best is not None else k


class _Method(NamedTuple):
    """The speculative method the release will run, after its refusals and fallbacks."""

    method: str
    model: str | None
    other_vocab: bool  # a draft with another vocabulary (or other tokens at the same size)
    ngram: str  # the name this release gives ngram


def _spec_method(
    plan: Plan, inst: InstancePlan, spec: SpeculativeConfig, rel: Release, warnings: list[str]
) -> _Method | None:
    """The planned method, or ngram where this release (or an offline host) cannot run the draft;
    None where the release speculates not at all on this instance."""
    table, draft = rel.spec_table(), plan.draft
    method, model = spec.method, spec.model
    if method == "draft_model" and not table["draft_model"]:
        warnings.append(
            f"vLLM {rel.table} (V1 engine) has no draft-model speculation (NotImplementedError until "
            f"{first_speculative('draft_model', exact=True)}): "
            f"ngram prompt lookup instead of {model}"
        )
        method, model = "ngram", None
    target_vocab, draft_vocab = plan.model.vocab_size, draft.vocab_size if draft else None
    other_vocab = bool(target_vocab and draft_vocab and target_vocab != draft_vocab)
    other_vocab = other_vocab or spec.use_heterogeneous_vocab is True  # same size, other tokens
    if method == "draft_model" and other_vocab and not table["heterogeneous_vocab"]:
        warnings.append(
            f"the draft {model} has another vocabulary ({draft_vocab} vs {target_vocab}): vLLM {rel.table} "
            f"refuses it ({first_speculative('heterogeneous_vocab')}+ accepts it with use_heterogeneous_vocab); "
            "ngram prompt lookup instead"
        )
        method, model = "ngram", None
    if (
        method == "draft_model"
        and plan.model.source in ("dir", "hf-cache")
        and (draft.source if draft else None) not in ("dir", "hf-cache")
    ):
        warnings.append(
            f"the draft {model} is not on this host and the target is served offline (HF_HUB_OFFLINE=1): "
            f"ngram prompt lookup instead; download the draft (hf download {model}) and re-plan "
            "to use it"
        )
        method, model = "ngram", None
    if (
        inst.device == "cpu"
        and table["cpu"] != "ok"
        and not (table["cpu"] == "draft_model_only" and method == "draft_model")
    ):
        why = (
            "its CPU backend never runs the speculative worker"
            if table["cpu"] == "not_applied"
            else "its CPU model runner refuses speculative decoding at start"
        )
        warnings.append(f"no speculative decoding on vLLM {rel.table}'s CPU backend ({why}): off")
        return None
    ngram = "[ngram]" if table["form"] == "legacy" and "[ngram]" in table["methods"] else "ngram"
    if (ngram if method == "ngram" else method) not in table["methods"]:
        warnings.append(
            f"speculative method {method} does not exist in vLLM {rel.table} "
            f"(has {', '.join(table['methods'])}): speculative decoding off"
        )
        return None
    return _Method(method, model, other_vocab, ngram)


class _Tokens(NamedTuple):
    """How many tokens to propose: a fixed k, k by batch size, or k until a batch size."""

    k: int
    disable_by_batch: int | None
    per_batch: list[list[int]] | None


def _spec_tokens(
    inst: InstancePlan, spec: SpeculativeConfig, method: str, rel: Release, warnings: list[str]
) -> _Tokens:
    """The plan's k (and its k-by-batch table) as this release can say it."""
    e, table = inst.engine, rel.spec_table()
    k = int(spec.num_speculative_tokens)
    by_batch = spec.num_speculative_tokens_per_batch_size or None  # ABSENT: none
    if not by_batch:
        return _Tokens(k, None, None)
    if table["per_batch_size"]:
        per_batch = [[lo, hi if hi is not None else max(lo, e.max_num_seqs), kk] for lo, hi, kk in by_batch]
        return _Tokens(k, None, per_batch)
    protection = table["disable_by_batch_size"]
    if protection == "draft_model_only":
        protection = "honoured" if method == "draft_model" else "ignored"
    off = next((row[0] for row in by_batch if row[2] <= 1), None)
    if protection == "honoured" and off is not None:
        k = by_batch[0][2] or k
        warnings.append(
            f"vLLM {rel.table} has no k by batch size ({first_speculative('per_batch_size')}+): k={k} at light "
            "load, speculation off "
            f"from batch size {off} (disable_by_batch_size), the nearest it offers"
        )
        return _Tokens(k, off, None)
    k = _fixed_k(by_batch, e.max_num_seqs, k)
    why = (
        "accepts disable_by_batch_size but never reads it (V1 engine)"
        if protection == "ignored"
        else f"has neither k by batch size ({first_speculative('per_batch_size')}+) nor disable_by_batch_size"
    )
    warnings.append(
        f"vLLM {rel.table} {why}: speculation runs with a fixed k={k} at every load (the k of "
        "the widest band of the plan's k-by-batch table); at high load a fixed k can be slower "
        "than no speculation"
    )
    return _Tokens(k, None, None)


def _draft_tp(inst: InstancePlan, method: str, rel: Release, warnings: list[str]) -> int | None:
    """The draft's tensor parallel size where the release needs it said (None: left out)."""
    if (
        method == "draft_model"
        and rel.spec_table()["chunked_prefill"] == "draft_tp_1"
        and inst.engine.enable_chunked_prefill
        and inst.tensor_parallel_size > 1
    ):
        warnings.append(
            f"vLLM {rel.table} needs the draft on one GPU with chunked prefill: draft tensor parallel size 1"
        )
        return 1
    return None


def _speculative(
    plan: Plan, inst: InstancePlan, e: EngineSettings, rel: Release, warnings: list[str]
) -> tuple[list[Pair], bool]:
    """The speculative-decoding arguments this release accepts and honours, and whether the
    instance speculates at all once the release's refusals are applied."""
    spec = inst.speculative
    if not spec:
        return [], False
    chosen = _spec_method(plan, inst, spec, rel, warnings)
    if chosen is None:
        return [], False
    method, model = chosen.method, chosen.model
    tokens = _spec_tokens(inst, spec, method, rel, warnings)
    draft_tp = _draft_tp(inst, method, rel, warnings)
    lookup_max = 4 if spec.prompt_lookup_max is ABSENT else spec.prompt_lookup_max
    lookup_min = 2 if spec.prompt_lookup_min is ABSENT else spec.prompt_lookup_min
    table = rel.spec_table()
    if table["form"] == "legacy":
        args: list[Pair] = [
            ("--speculative-model", model if method == "draft_model" else chosen.ngram),
            ("--num-speculative-tokens", tokens.k),
        ]
        if method == "ngram":
            args += [("--ngram-prompt-lookup-max", lookup_max), ("--ngram-prompt-lookup-min", lookup_min)]
        if draft_tp is not None:
            args.append(("--speculative-draft-tensor-parallel-size", draft_tp))
        if tokens.disable_by_batch is not None:
            args.append(("--speculative-disable-by-batch-size", tokens.disable_by_batch))
        return args, True
    # The draft's tensor parallel size is left out: unset means the target's, which every release
    # accepts (0.15+ requires it equal; 0.6.3 refuses anything but 1 when given).
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": tokens.k}
    if model:
        cfg["model"] = model
    if method == "ngram":
        cfg["prompt_lookup_max"], cfg["prompt_lookup_min"] = lookup_max, lookup_min
    if method == "draft_model" and chosen.other_vocab:
        cfg["use_heterogeneous_vocab"] = True  # needs greedy draft sampling, vLLM's default
    if tokens.disable_by_batch is not None:
        cfg["disable_by_batch_size"] = tokens.disable_by_batch
    if tokens.per_batch:
        cfg["num_speculative_tokens_per_batch_size"] = tokens.per_batch
    for key in [key for key in cfg if key not in table["keys"]]:
        warnings.append(f"speculative key {key} does not exist in vLLM {rel.table}: dropped")
        del cfg[key]
    return [("--speculative-config", json.dumps(cfg, separators=(",", ":")))], True
