"""Models larger than one host: a plan over several hosts' snapshots (``--from A --from B ...``).

``layout.nodes`` (auto: the fewest that fit) decides how many hosts one vLLM runs over, and how:

- **one node fits**: that node alone (the others are not used; ``layout.nodes=N`` instead makes them
  data-parallel ranks of one server: one rank per node, the API server on node 0);
- **it does not**: pipeline parallel across nodes, tensor parallel inside each (never tensor
  parallel across the inter-node link when avoidable: an all-reduce per layer would cross it, where a
  pipeline boundary sends one hidden vector per token); each node holds one stage, about
  ``layers / nodes`` of the layers (the first and last also the embeddings), planned on that node's
  GPUs like a one-host plan of that stage;
- ``layout.tensor_parallel_size`` larger than one node's devices: tensor parallel across nodes, as
  asked, with a warning.

Every node's instance carries its rank, the group size and the rendezvous (``layout.master_addr``,
default node 0's address; ``layout.master_port``); node 0 runs the API server, the others run
headless. The inter-node link (``layout.internode_gbps``, ``internode_latency_us``) is in each
instance's estimate, with the group's decode ceiling over it (:func:`link_cost`). When even every
node given does not fit, the refusal says what would. Pure: snapshots in, instances out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..config.settings import Settings
from ..host.snapshot import HostSnapshot
from ..model import ModelFacts
from ..model.facts import embed_params
from ..release import release_of
from .context import PlanContext
from .reasons import Reasons
from .refusal import PlanRefused
from .tpsplit import tp_refusal
from .types import InstancePlan

# one host's instances for (host, settings, model): the planner's own one-host path
Plan1 = Callable[[HostSnapshot, Settings, ModelFacts], list[InstancePlan]]


def stage_of(model: ModelFacts, stages: int) -> ModelFacts:
    """The largest pipeline stage of ``model`` split in ``stages``: its share of the decoder layers
    (rounded up) and of their weights, plus the embeddings (the first stage holds the input
    embedding, the last the LM head: counted whole, to be safe)."""
    if stages <= 1:
        return model
    layers = -(-model.num_layers // stages)
    sliding = -(-model.sliding_layers // stages)
    embed_bytes = (
        embed_params(model.vocab_size, model.hidden_size, model.tie_word_embeddings) * model.dtype_bytes
    )
    body = max(0, model.weights_bytes - embed_bytes)
    return model._replace(
        name=f"{model.name} (stage of {stages})",
        num_layers=layers,
        sliding_layers=min(sliding, layers),
        weights_bytes=-(-body // stages) + embed_bytes,
        mxfp4_expert_bytes=-(-model.mxfp4_expert_bytes // stages),  # padded at the stage's own TP
        expert_kernel_bytes=-(-model.expert_kernel_bytes // stages),
        params=-(-model.params // stages),
        active_params=-(-(model.active_params or model.params) // stages),
        stack=model.stack._replace(kinds=model.stack.kinds[:layers]) if model.stack is not None else None,
    )


USER_LAYERS = frozenset({"cli", "env", "overrides", "overrides.d"})  # what a person set (a profile is not)


def _user_set(r: Reasons, key: tuple[str, ...]) -> bool:
    src = r.provenance.get(key)
    return src is not None and src.kind in USER_LAYERS


def _with(settings: Settings, **layout: Any) -> Settings:
    return dataclasses.replace(settings, layout=dataclasses.replace(settings.layout, **layout))


def plan_nodes(
    ctx: PlanContext,
    hosts: Sequence[HostSnapshot],
    addresses: Sequence[str],
    model: ModelFacts,
    one_host: Plan1,
) -> list[InstancePlan]:
    """The instances of a plan over ``hosts`` (node 0 first), each marked with its node."""
    settings = ctx.settings
    n = len(hosts)
    want = settings.layout.nodes
    if isinstance(want, int) and want > n:
        raise PlanRefused(
            f"layout.nodes={want}, but {n} host snapshots were given", [f"--set layout.nodes={n}"]
        )
    nodes = _Nodes(ctx, hosts, addresses, model, one_host)
    tp = settings.layout.tensor_parallel_size
    if isinstance(tp, int) and tp > nodes.devices[0]:  # tensor parallel across nodes, as asked
        return nodes.tensor_across(tp)
    if want in ("auto", 1):
        alone = nodes.one_node(want)
        if alone is not None:
            return alone
    if isinstance(want, int) and want > 1:
        ranks = nodes.data_parallel(want)
        if ranks is not None:
            return ranks
    return nodes.pipeline(want, tp)


@dataclasses.dataclass
class _Nodes:
    """One multi-node plan's inputs and the layouts tried in turn; a try that does not fit leaves no
    reason or warning behind, and its refusal is kept for the final one."""

    ctx: PlanContext
    hosts: Sequence[HostSnapshot]
    addresses: Sequence[str]
    model: ModelFacts
    one_host: Plan1
    first_error: PlanRefused | None = None
    devices: list[int] = dataclasses.field(init=False)  # each node's; a CPU host is one device
    marks: tuple[int, int] = dataclasses.field(init=False)  # reasons and warnings before any try

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    def __post_init__(self) -> None:
        self.devices = [len(h.usable_gpus) or 1 for h in self.hosts]  # a CPU host is one device
        self.marks = (len(self.ctx.reasons.items), len(self.ctx.warnings))

    def _failed(self, e: PlanRefused) -> None:
        del self.ctx.reasons.items[self.marks[0] :]
        del self.ctx.warnings[self.marks[1] :]
        self.first_error = e

    def _done(self, insts: list[InstancePlan], how: str) -> list[InstancePlan]:
        return _mark(_link(insts, how, self.model, self.settings), self.addresses, self.settings)

    def tensor_across(self, tp: int) -> list[InstancePlan]:
        """Tensor parallel across nodes, as ``layout.tensor_parallel_size`` asks, with a warning."""
        n, settings, model = len(self.hosts), self.settings, self.model
        per = self.devices[0]
        k = -(-tp // per)
        if k > n or tp % per:
            raise PlanRefused(
                f"tensor_parallel_size={tp} over nodes of {per} devices needs {k} of them, {n} given",
                [f"--set layout.tensor_parallel_size={per * n}"],
            )
        why = tp_refusal(model, tp, release_of(self.ctx.version).fp8_moe_refine())
        if why is not None:
            raise PlanRefused(f"tensor_parallel_size={tp} for {model.name}: {why}", [])
        self.ctx.warn(
            f"tensor parallel {tp} across {k} nodes: an all-reduce per layer crosses the {settings.layout.internode_gbps:g} "
            "Gb/s link between them (pipeline parallel across nodes sends far less)"
        )
        self.ctx.add(
            "layout.nodes", k, f"tensor_parallel_size={tp} is more than one node's {per} device(s)", _SRC
        )
        node0 = self.one_host(
            self.hosts[0],
            # layout.nodes: the node's share of a TP group across k nodes (its collectives' buffers)
            _with(settings, tensor_parallel_size=per, replicas=1, shape="servers", nodes=k),
            _shard(model, k),
        )
        insts = [dataclasses.replace(node0[0], tensor_parallel_size=tp)] * k
        return self._done(insts, "tensor")

    def one_node(self, want: int | str) -> list[InstancePlan] | None:
        """Node 0 alone, where the model fits it (None: it does not, and ``layout.nodes`` is auto)."""
        n, model = len(self.hosts), self.model
        try:
            alone = self.one_host(
                self.hosts[0], _with(self.settings, nodes=1), model
            )  # no group across nodes
        except PlanRefused as e:
            if want == 1:
                raise
            self._failed(e)
            return None
        if n > 1:
            self.ctx.warn(
                f"{model.name} fits one node: nodes 1-{n - 1} are not used "
                f"(--set layout.nodes={n}: one data-parallel rank on each)"
            )
        self.ctx.add("layout.nodes", 1, f"{model.name} fits one node", _SRC)
        return alone

    def data_parallel(self, want: int) -> list[InstancePlan] | None:
        """One data-parallel rank per node, where one node holds the model (None: it does not)."""
        try:  # one node suffices: a data-parallel rank per node
            each = self.one_host(
                self.hosts[0], _with(self.settings, replicas=1, shape="servers", nodes=1), self.model
            )
            if len(each) == 1:
                self.ctx.add(
                    "layout.nodes",
                    want,
                    f"layout.nodes={want}; one node holds the model: one data-parallel "
                    "rank on each, one API server on node 0",
                    _SRC,
                )
                insts = [dataclasses.replace(each[0], data_parallel_size=want)] * want
                return self._done(insts, "data")
        except PlanRefused as e:
            self._failed(e)
        return None

    def pipeline(self, want: int | str, tp: int | str) -> list[InstancePlan]:
        """Pipeline parallel over the fewest nodes that fit (or ``layout.nodes``), tensor parallel
        inside each; refused, with what would fit, when even every node does not."""
        n, model = len(self.hosts), self.model
        # Inside a node, a profile's tensor parallel size may grow to the node's devices for a stage to fit
        # (a profile sizes one-host servers); one the user set is kept.
        tries: list[int | str] = [tp]
        if not _user_set(self.ctx.reasons, ("layout", "tensor_parallel_size")):
            tries += [
                t for t in (2, 4, 8, 16) if t <= min(self.devices) and (not isinstance(tp, int) or t > tp)
            ]
        for k in range(2, n + 1) if want == "auto" else [int(want)]:
            stage = stage_of(model, k)
            per_node = self._stages(k, tries, stage)
            if per_node is None:
                continue
            tps = {p[0].tensor_parallel_size for p in per_node}
            if len(tps) > 1 or any(len(p) != 1 for p in per_node):
                raise PlanRefused(
                    f"the nodes differ (tensor parallel {sorted(tps)}): a pipeline needs the same on each",
                    ["snapshots of hosts with the same GPUs"],
                )
            self.ctx.add(
                "layout.nodes",
                k,
                f"{model.name} does not fit one node: pipeline parallel over {k} nodes "
                f"(tensor parallel {tps.pop()} inside each), about {stage.num_layers} "
                "layers a node",
                _SRC,
            )
            return self._done([p[0] for p in per_node], "pipeline")
        first_error = self.first_error
        raise PlanRefused(
            f"{model.name} does not fit even {n} node(s): {first_error.message if first_error else 'no layout'}",
            [*(first_error.suggestions if first_error else []), "more nodes (another --from snapshot)"],
        )

    def _stages(self, k: int, tries: list[int | str], stage: ModelFacts) -> list[list[InstancePlan]] | None:
        """Each of the first ``k`` nodes' instances for one pipeline stage, at the first tensor
        parallel size of ``tries`` that fits (None: none does)."""
        for t in tries:
            try:
                return [
                    self.one_host(
                        h,
                        _with(
                            self.settings,
                            strategy="tensor_parallel",
                            replicas=1,
                            shape="servers",
                            pipeline_parallel_size=k,
                            tensor_parallel_size=t,
                        ),
                        stage,
                    )
                    for h in self.hosts[:k]
                ]
            except PlanRefused as e:
                self._failed(e)
        return None


_SRC = ("layout", "nodes")


def _shard(model: ModelFacts, ways: int) -> ModelFacts:
    """One node's share of a model tensor-parallel across ``ways`` nodes (weights split, KV heads too)."""
    if ways <= 1:
        return model
    replicated = min(model.replicated_bytes, model.weights_bytes)  # whole on every rank, so every node
    return model._replace(
        weights_bytes=-(-(model.weights_bytes - replicated) // ways) + replicated,
        # a node's share of the MXFP4 experts, each rank's width that of the whole TP across the nodes
        mxfp4_expert_bytes=-(-model.mxfp4_expert_bytes // ways),
        expert_kernel_bytes=-(-model.expert_kernel_bytes // ways),
        moe_intermediate_size=model.moe_intermediate_size // ways,
        quant_grid=None,  # checked at the whole TP before the split (_Nodes.tensor_across)
        num_kv_heads=max(1, model.num_kv_heads // ways),
        num_heads=max(1, model.num_heads // ways),
    )


ACTIVATION_BYTES = 2  # a token's hidden state crosses the link in 16-bit (bf16/fp16 activations)


def link_cost(kind: str, nodes: int, model: ModelFacts) -> tuple[int, int]:
    """(bytes each node sends, messages in sequence) over the link between nodes per decoded token at
    batch 1. Pipeline: the hidden state once per stage boundary. Tensor: two all-reduces of it per
    decoder layer (after attention, after the MLP), each a ring over the nodes: 2(k-1) steps of
    1/k of it. Data: the ranks serve apart, nothing per token."""
    vec = model.hidden_size * ACTIVATION_BYTES
    if nodes <= 1 or kind == "data":
        return 0, 0
    if kind == "pipeline":
        return (nodes - 1) * vec, nodes - 1
    steps = 2 * (nodes - 1)
    return 2 * model.num_layers * steps * vec // nodes, 2 * model.num_layers * steps


def _link(insts: list[InstancePlan], kind: str, model: ModelFacts, settings: Settings) -> list[InstancePlan]:
    """Each node's instance with the group's link figures in its estimate (layout.internode_gbps and
    internode_latency_us), and the whole group's batch-1 decode ceiling with the link's time added:
    a pipeline's stages run one after another for one token, so their times add up."""
    k = len(insts)
    gbps, lat = settings.layout.internode_gbps, settings.layout.internode_latency_us
    sent, messages = link_cost(kind, k, model)
    secs = sent * 8 / (gbps * 1e9) + messages * lat * 1e-6
    ceilings = [
        c for i in insts if isinstance(c := i.estimate.decode_tok_s_ceiling_batch1, (int, float)) and c > 0
    ]
    group: float | None = None
    if len(ceilings) == len(insts):
        compute = sum(1 / c for c in ceilings) if kind == "pipeline" else 1 / ceilings[0]
        group = round(1 / (compute + secs), 1)
    basis = {
        "pipeline": f"{k} stages in turn for each token, the hidden state ({model.hidden_size} x {ACTIVATION_BYTES} "
        f"bytes) crossing {k - 1} stage boundaries",
        "tensor": f"2 all-reduces per layer x {model.num_layers} layers, each a ring over {k} nodes "
        f"({2 * (k - 1)} steps of 1/{k} of the hidden state)",
        "data": f"{k} data-parallel ranks serve apart: nothing crosses the link per token (batch 1 is one "
        f"rank's speed; {k} ranks carry {k} times the load)",
    }[kind]
    out = []
    for inst in insts:
        est = dataclasses.replace(
            inst.estimate,
            nodes_parallel=kind,
            internode_gbps=gbps,
            internode_latency_us=lat,
            internode_bytes_per_token=sent,
            internode_ms_per_token=round(secs * 1e3, 4),
            internode_basis=basis + f"; bytes / {gbps:g} Gb/s + messages x {lat:g} µs (no overlap assumed)",
            decode_tok_s_ceiling_batch1_group=inst.estimate.decode_tok_s_ceiling_batch1_group
            if group is None
            else group,
        )
        out.append(dataclasses.replace(inst, estimate=est))
    return out


def _mark(insts: list[InstancePlan], addresses: Sequence[str], settings: Settings) -> list[InstancePlan]:
    """Each node's instance with its rank, the group and the rendezvous; one name for the group."""
    k = len(insts)
    given = settings.layout.master_addr  # None: node 0's own address
    master = given if given is not None else addresses[0]
    base = insts[0].name
    return [
        dataclasses.replace(
            inst,
            name=f"{base}-node{rank}",
            node_rank=rank,
            nnodes=k,
            node_address=addr,
            master_addr=master,
            master_port=settings.layout.master_port,
            node_backend=settings.layout.multinode_backend,
            server=inst.server if rank == 0 else dataclasses.replace(inst.server, port=insts[0].server.port),
        )
        for rank, (inst, addr) in enumerate(zip(insts, addresses, strict=False))
    ]
