"""The named workloads of ``hwprofile bench`` as data, built from the resolved ``bench.*`` settings.

- ``seed``: the seed's shape: ``bench.concurrency`` (16) concurrent requests of ``bench.input_len`` (512)
  random prompt tokens and ``bench.output_len`` (256) output tokens;
- ``latency``: the same requests one at a time (concurrency 1);
- ``sweep``: the saturation sweep, concurrency 1, 2, 4, … up to ``bench.sweep_max`` (64; itself
  included when it is not a power of two), judged against ``bench.ttft_p99_target_ms``.

Every point sends ``bench.num_prompts`` requests, and never fewer than its concurrency. Output is
greedy (temperature 0) and the prompts come from a fixed seed, so two plans see the same requests.

The prompts (``bench.dataset``): random tokens of ``bench.input_len``, or real prompts, the shipped
written set ``hwprofile/data/bench_prompts.json`` (ShareGPT format, read by ``vllm bench serve``'s
``sharegpt`` dataset; each prompt its own length). ``auto`` takes real prompts wherever a plan
speculates: a draft's (MTP, n-gram, EAGLE) acceptance on random tokens is no measure of real traffic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from importlib.resources import files
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.settings import Bench, Settings

NAMES = ("seed", "latency", "sweep")
DATASETS = ("random", "prompts")


def prompts_path() -> str:
    """The shipped real prompts (ShareGPT format) ``bench.dataset: prompts`` sends."""
    return str(files("hwprofile.data").joinpath("bench_prompts.json"))


def bench_settings(settings: Settings) -> Bench:
    """The ``bench`` section of the resolved settings: the one place bench reads them."""
    return settings.bench


@dataclass(frozen=True)
class Workload:
    name: str
    concurrencies: tuple[int, ...]
    input_len: int
    output_len: int
    num_prompts: int
    ttft_p99_target_ms: float
    primary: int  # the concurrency a comparison's headline ratio and the verdict are taken at
    dataset: str = "random"  # "random" or "prompts" (DATASETS); "auto" until resolve_dataset
    temperature: float = 0.0
    seed: int = 0
    dataset_why: str = ""

    def prompts_at(self, concurrency: int) -> int:
        """Requests sent at one point: ``num_prompts``, at least one per concurrent slot."""
        return max(self.num_prompts, concurrency)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrencies"] = list(self.concurrencies)
        return d


def sweep_points(top: int) -> tuple[int, ...]:
    """1, 2, 4, … up to ``top``, and ``top`` itself."""
    out: list[int] = []
    c = 1
    while c < top:
        out.append(c)
        c *= 2
    out.append(top)
    return tuple(out)


def workload(name: str, s: Bench) -> Workload:
    """The named workload from the settings (``ValueError`` for an unknown name)."""

    def make(kind: str, concurrencies: tuple[int, ...], primary: int) -> Workload:
        return Workload(
            kind,
            concurrencies,
            input_len=s.input_len,
            output_len=s.output_len,
            num_prompts=s.num_prompts,
            ttft_p99_target_ms=s.ttft_p99_target_ms,
            primary=primary,
            dataset=s.dataset,
        )

    if name == "seed":
        return make("seed", (s.concurrency,), s.concurrency)
    if name == "latency":
        return make("latency", (1,), 1)
    if name == "sweep":
        pts = sweep_points(s.sweep_max)
        return make("sweep", pts, s.concurrency if s.concurrency in pts else pts[-1])
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(NAMES)}")


def resolve_dataset(wl: Workload, speculates: bool | None) -> Workload:
    """``wl`` with ``bench.dataset: auto`` decided, and why: real prompts where a plan speculates
    (``speculates`` True), random tokens where none does (False); unknown (None: a server at --url
    whose metrics did not say) takes real prompts, the choice that is right either way."""
    if wl.dataset != "auto":
        return replace(wl, dataset_why=f"bench.dataset: {wl.dataset}")
    if speculates is False:
        return replace(wl, dataset="random", dataset_why="bench.dataset auto: no plan speculates")
    why = (
        "a plan speculates: its draft's acceptance is measured on real prompts, never random tokens"
        if speculates
        else "whether the server speculates is not known: real prompts, right either way"
    )
    return replace(wl, dataset="prompts", dataset_why=f"bench.dataset auto: {why}")
