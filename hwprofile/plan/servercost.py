"""CPU work outside the GPU's step, as plan/simulate.py takes it (issue 32): vLLM's API server (one asyncio
process in front of EngineCore since V1) and the engine step's CPU per scheduled sequence.

Pure: a vLLM release (and the host's CPU, which only widens the band; on the CPU backend, the CPUs an
instance's OpenMP threads leave its API server) in, the costs with their sources out.

What is serial with what, read in vLLM 0.11.0's code (``pip download --no-deps vllm==0.11.0``):

- ``vllm/v1/engine/async_llm.py``, ``output_handler``: one task of the API server's event loop pulls each
  step's outputs from EngineCore and detokenizes them (``OutputProcessor.process_outputs``) in chunks of
  ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` (128) requests, yielding to the loop between chunks; each request's
  handler then writes its SSE chunk. Request handlers (HTTP, tokenization through
  ``AsyncMicrobatchTokenizer``, ``add_request``) share that one loop: a per-request cost and a per-output-token
  cost on one CPU. EngineCore is another process and does not wait for the API server.
- ``vllm/config/scheduler.py``: ``async_scheduling: bool = False`` in 0.11 (the engine's CPU work for a step
  is serial with the GPU's); 0.32's default is ``None``, which ``vllm/config/vllm.py`` turns on wherever the
  executor supports it (the CPU work of step n+1 overlaps the GPU's of step n). The first release with the
  new default is taken as 0.12 (vLLM PR #27614, Nov 2025; vllm-gaudi #768 followed it): not read in its code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host.snapshot import parse_cpulist
from ..record import record
from ..release import floor_of, release_of

if TYPE_CHECKING:
    from ..host.snapshot import HostSnapshot
    from .types import InstancePlan

# Evidence for the orders of magnitude, none of it a figure of these hosts:
# - vLLM issue #6801 (V0, 2024): "when BS is 200, [sampling, prepare input, process output, scheduler]
#   together can be 20 ms" between two steps: ~100 us per running sequence per step;
# - openfabric-systems/simllm PR #204 (vLLM 0.27 CPU engine, cProfile): the scheduler alone ~12.7 us per
#   running request per all-decode step, growing with the running set;
# - vllm-project/tpu-inference PR #2123, ai-dynamo/dynamo PR #865: one API server process (the default
#   ``--api-server-count 1``) becomes the bottleneck at high concurrency (tokenization, streaming).
# The values below are fitted (benchmarks/fit_servercost.py) on the main serving set
# (benchmarks/data/validation_serving.yaml, vLLM 0.11.0), never on the held-out one. Refitted
# once the H100 points' GPU side no longer dominated (gpu_efficiency.yaml's Hopper row): 60 us per scheduled
# sequence (was 30) puts 29 of the 48 main figures within the bars against 27 (held-out unchanged, 9 of 12);
# 0.11 runs that CPU serially with the GPU's step, and with 1,024 sequences (H100's default) it is 60 ms.
# Refitted once the ShareGPT points were simulated with their lengths' spread (plan/simulate.py
# request_lengths; those points were the evidence for the per-token cost): 6 ms per request and 50 us per
# streamed token (were 4 ms, 100 us) put 36 of the 48 main figures within against 34 (grid `small`; the
# grid is flat within 2 figures, the held-out set 9 of 12 at every candidate of it).
# Refitted once the API server's admissions of a burst were simulated as the event loop shares them (processor
# sharing, plan/simulate.py: a burst reaches the engine together and its decode tokens ride full steps)
# and per chat renderer (below): 12 ms per request through a chat template, 2 ms through Harmony, 50 us
# per streamed token, 30 us per scheduled sequence put 46 of the 48 main figures within against 36 with
# one 6 ms for both and 60 us (benchmarks/fit_servercost.py, grid `small`).
# Every run went through the chat endpoint (`vllm bench serve --backend openai-chat`), which renders a
# request's messages one of two ways (vllm/entrypoints/openai/serving_chat.py, 0.11: ``use_harmony =
# model_type == "gpt_oss"``): gpt-oss through Harmony (openai_harmony, in Rust: token ids directly, no
# chat template, no tokenizer call), every other model through its Jinja chat template, rendered on the
# event loop (``apply_hf_chat_template``), then the tokenizer (``AsyncMicrobatchTokenizer``). The lab's
# bursts of 128 in / 4 out on the same hosts: Qwen3-14B 37-44 requests/s, gpt-oss-20b 184-213.
# The completions endpoint (what `hwprofile bench` sends) renders nothing: the prompt goes to the
# tokenizer as it is. No published figure isolates it; taken as Harmony's (neither renders a chat template
# on the event loop), which this project's CPU VM agrees with: vLLM 0.32's API server process spent 2.05 ms
# of CPU per streamed /v1/completions request of one token (docs/validation-serving.md).
HARMONY_MODEL_TYPES = frozenset({"gpt_oss"})
API_REQUEST_S = {"template": 0.012, "harmony": 0.002, "completion": 0.002}
RENDERED = {  # what each cost per request is, as the source says it
    "harmony": "chat request rendered through Harmony",
    "template": "chat request rendered through its chat template and the tokenizer",
    "completion": "completions request: no chat template, the tokenizer alone; taken as Harmony's, "
    "no figure isolates it",
}
API_TOKEN_S = 50e-6
STEP_SEQ_S = 30e-6
# the output handler is one task among the request handlers of one event loop (round robin, not priority):
# while requests wait to be admitted, the outputs get about half of the CPU
API_TOKEN_SHARE = 0.5
FITTED_ON = "benchmarks/data/validation_serving.yaml (GPUStack performance lab, H100/A100 hosts)"


@record
class ServerCosts:
    """The CPU costs plan/simulate.py's Engine takes, with where they come from."""

    api_request_s: float  # the API server's CPU per request (HTTP, chat rendering, tokenization, set-up)
    api_token_s: float  # the API server's CPU per streamed output token (detokenization, SSE)
    api_token_share: float  # the API server's CPU the outputs get while requests wait to be admitted
    step_seq_s: float  # the engine's CPU per scheduled sequence per step
    async_scheduling: bool | None  # the engine's CPU overlaps the GPU's step; None: release unknown
    source: str
    renderer: str = "completion"  # how a request is rendered: "template", "harmony" or "completion"
    # the API server's CPU per engine step that streams tokens (its output handler's wake-up, the step's
    # outputs received and decoded): measured on a calibrated host (0: not modelled; the fitted costs
    # per request and per token hold it)
    api_step_s: float = 0.0
    # the API server's CPU per request at its end (the last chunk, the response closed), off the TTFT's
    # path: measured on a calibrated host whose bench ran concurrencies whose steps differ (0: the
    # fitted costs per request and per token hold it)
    api_finish_s: float = 0.0
    # the API server shares a CPU with EngineCore (a CPU backend whose OpenMP threads leave fewer CPUs than
    # those processes, or an unknown number): a request's work outside the engine's steps (the client's,
    # HTTP, tokenization, the hand-over) runs on that CPU, behind the outputs' work in a closed loop
    frontend_shared: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "api_request_ms": round(self.api_request_s * 1e3, 3),
            "api_token_us": round(self.api_token_s * 1e6, 1),
            "api_step_us": round(self.api_step_s * 1e6, 1),
            "api_finish_ms": round(self.api_finish_s * 1e3, 3),
            "api_token_share": self.api_token_share,
            "step_seq_us": round(self.step_seq_s * 1e6, 1),
            "async_scheduling": self.async_scheduling,
            "renderer": self.renderer,
            "frontend_shared": self.frontend_shared,
            "source": self.source,
        }


def async_scheduling_default(vllm_version: str | None) -> bool | None:
    """Whether ``vllm serve`` schedules asynchronously by default in this release; None: unknown
    (hwprofile/release's ``async_scheduling_default`` floor)."""
    return release_of(vllm_version).async_scheduling_default()


def chat_renderer(model_type: str | None) -> str:
    """How vLLM's chat endpoint renders a request for a model of ``model_type``: "harmony" (gpt-oss: token
    ids straight from openai_harmony) or "template" (its chat template, then the tokenizer). The
    completions endpoint renders nothing ("completion")."""
    return "harmony" if model_type in HARMONY_MODEL_TYPES else "template"


def frontend_cpus(inst: InstancePlan, host: HostSnapshot) -> int | None:
    """The CPUs ``inst``'s OpenMP threads leave to its API server and EngineCore(s) (:func:`server_costs`:
    fewer than those processes, and the API server's work per token is serial with the step), as vLLM's
    ``vllm/utils/ompmultiprocessing.py`` binds them: the operator's lists (``|``-separated, one per rank),
    or ``auto``: rank r on NUMA node r, one logical CPU per physical core, ``reserve_cpu_num`` (one per
    rank) of them kept back. The snapshot does not say which CPUs are SMT siblings: ``auto`` takes none
    (a host with SMT leaves its siblings free, which this counts low). ``nobind``: the threads run on every
    CPU (0). The instance's CPUs: its NUMA binding's, else the host's; other instances on the same CPUs
    are not counted. None: the CPUs or a list are unknown."""
    try:
        nodes = [set(parse_cpulist(n.cpus)) for n in host.numa_nodes]
        mine = set(parse_cpulist(inst.cpus)) if inst.cpus else set().union(*nodes)
        if not mine and host.cpu.logical_cpus:
            mine = set(range(host.cpu.logical_cpus))
        if not mine:
            return None
        bind = inst.omp_threads_bind
        if bind == "nobind":
            return 0
        if isinstance(bind, str):
            omp = set().union(*(parse_cpulist(x) for x in bind.split("|")))
            return len(mine - omp)
    except ValueError:
        return None
    ranks = inst.tensor_parallel_size * inst.pipeline_parallel_size * inst.ranks
    used = [n & mine for n in nodes if n & mine] or [mine]
    omp = set().union(*used[:ranks])
    reserved = ranks if len(omp) > ranks else 0
    return len(mine - omp) + reserved


def server_costs(
    vllm_version: str | None,
    cpu_model: str | None = None,
    cpu_backend: bool = False,
    frontend: int | None = None,
    engines: int = 1,
    renderer: str = "completion",
) -> ServerCosts:
    """The costs for a host running ``vllm_version`` and a model whose chat requests its API server
    renders with ``renderer`` (:func:`chat_renderer`) (``cpu_backend``: vLLM's CPU backend, which turns
    async scheduling off whatever the release's default; ``frontend``: the CPUs that backend's OpenMP
    threads leave to the API server and the ``engines`` EngineCore processes, :func:`frontend_cpus`;
    None: unknown). The CPU's speed would scale them, but no CPU table says how fast a
    model runs vLLM's Python: the host's CPU is named in the source (the band widens on a CPU unlike the
    validation hosts'), not scaled by.

    With fewer such CPUs than those processes (vLLM's own ``auto`` on a host without SMT siblings: one
    per rank), the API server's work per streamed token runs on a CPU EngineCore schedules on: it is
    serial with the step, so each scheduled sequence costs the step that work too (``step_seq_s``). A GPU
    host's API server has CPUs of its own: its work delays the tokens' delivery, not the engine."""
    asy = async_scheduling_default(vllm_version)
    since = floor_of("async_scheduling_default")
    cpu = f"; this host's CPU ({cpu_model}) not scaled for" if cpu_model else "; this host's CPU unknown"
    how = (
        f"async scheduling on by default (from {since}): the engine's CPU overlaps the GPU's step"
        if asy
        else f"no async scheduling (before {since}): the engine's CPU adds to the GPU's step"
        if asy is not None
        else "vLLM release unknown: the engine's CPU taken as adding to the GPU's step"
    )
    step_seq, shared = STEP_SEQ_S, False
    if cpu_backend:  # vllm/platforms/cpu.py (0.32): "async scheduling is not required on CPU", set False
        asy = False
        step_seq, shared, how = _cpu_backend_step(frontend, engines)
    if renderer not in API_REQUEST_S:
        raise ValueError(f"renderer {renderer!r}: {', '.join(sorted(API_REQUEST_S))}")
    request_s = API_REQUEST_S[renderer]
    through = RENDERED[renderer]
    return ServerCosts(
        request_s,
        API_TOKEN_S,
        API_TOKEN_SHARE,
        step_seq,
        asy,
        f"fitted on {FITTED_ON}: API server {request_s * 1e3:g} ms per request ({through}) and "
        f"{API_TOKEN_S * 1e6:g} us per streamed token, engine {STEP_SEQ_S * 1e6:g} us per "
        f"scheduled sequence per step; {how}{cpu}",
        renderer,
        frontend_shared=shared,
    )


def _cpu_backend_step(frontend: int | None, engines: int) -> tuple[float, bool, str]:
    """vLLM's CPU backend's engine CPU per scheduled sequence, whether the API server shares a CPU with
    the ``engines`` EngineCore processes (``frontend``: the CPUs the OpenMP threads leave them; None:
    unknown), and how that is said."""
    how = "the CPU backend never schedules asynchronously: the engine's CPU adds to the step"
    if frontend is not None and frontend >= engines + 1:
        return STEP_SEQ_S, False, how
    # (a calibrated host's API server CPU per engine step, ServerCosts.api_step_s, is not added here:
    # once a step, whatever its sequences, it is inside the step's fixed time fitted there)
    step_seq = STEP_SEQ_S + API_TOKEN_S
    left = "an unknown number of CPUs" if frontend is None else f"{frontend} CPU(s)"
    return (
        step_seq,
        True,
        how + f"; the OpenMP threads leave {left} to the API server and {engines} EngineCore(s): the API "
        f"server's {API_TOKEN_S * 1e6:g} us per streamed token adds to each scheduled sequence's "
        f"step ({step_seq * 1e6:g} us in all)",
    )


# a point whose client median TPOT is below this share of the server's own mean TPOT: its streamed
# tokens reached the client merged (merged_stream)
MERGED_SHARE = 0.5


def merged_stream(client_tpot_ms: object, server_tpot_ms: object) -> str | None:
    """Why a point's client latencies do not time the engine's tokens, or None where nothing says so.
    vLLM's API server merges a request's streamed outputs when its stream falls behind the engine
    (``RequestOutputCollector.put``, vLLM 0.32): the client then sees several tokens in one chunk, its
    TTFT stretched and its TPOT near 0. Seen on this project's 2-CPU VM with real vLLM: at one client,
    one of three repeats of 32 requests had most requests' 48 tokens arrive at once (its median TTFT
    133 ms, TPOT 0.003 ms; the server's own TPOT 2.6 ms), another about half of them. Said where the
    client's median TPOT is below :data:`MERGED_SHARE` of the server's mean (its /metrics histogram);
    None where either is unknown."""
    figures = (client_tpot_ms, server_tpot_ms)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in figures):
        return None
    client, server = (float(x) for x in figures if isinstance(x, (int, float)))
    if server <= 0 or client >= MERGED_SHARE * server:
        return None
    return (
        f"the client's median TPOT {client:.3g} ms is below {MERGED_SHARE:.0%} of the server's "
        f"{server:.3g} ms: the API server streamed tokens merged (its stream fell behind the engine), "
        "so the client's TTFT and TPOT do not time the engine's tokens"
    )
