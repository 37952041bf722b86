"""The GPU datasheet table (``hwprofile/data/gpus.yaml``): bandwidth, FP8 support, NVLink, PCIe."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


@lru_cache(maxsize=1)
def table() -> list[dict[str, Any]]:
    from ..config.yamlsrc import load_file

    return list(
        load_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "gpus.yaml"))[0]["gpus"]
    )


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


def lookup(nvml_name: str | None, memory_gib: float | None = None) -> dict[str, Any] | None:
    """The row whose NVML names include ``nvml_name``; else the row whose name is contained in it
    (longest first), preferring the memory size that matches."""
    if not nvml_name:
        return None
    rows = table()
    for r in rows:
        if nvml_name in (r.get("nvml_names") or []):
            return r
    n = _norm(nvml_name)
    hits = [r for r in rows if _norm(str(r["name"]).replace("GeForce ", "")) in n or _norm(r["name"]) in n]
    if memory_gib is not None and hits:
        close = [
            r
            for r in hits
            if r.get("memory_gb") and abs(r["memory_gb"] - memory_gib * 1.074) / r["memory_gb"] < 0.15
        ]
        hits = close or hits
    hits.sort(key=lambda r: -len(str(r["name"])))
    return hits[0] if hits else None


@lru_cache(maxsize=1)
def efficiency_table() -> dict[str, Any]:
    """``hwprofile/data/gpu_efficiency.yaml``: the share of the datasheet each architecture reaches."""
    from ..config.yamlsrc import load_file

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "gpu_efficiency.yaml")
    return dict(load_file(path)[0])


def efficiency(architecture: str | None, segment: str | None = None) -> dict[str, Any]:
    """The memory and compute shares for ``architecture`` (a gpus.yaml row's): the entry for that chip in
    that market ``segment`` ("Ampere (GA102) GeForce": GeForce parts accumulate in FP32 at half the
    tensor rate, the workstation and datacenter parts of the same chip at the full rate), else the
    chip's, else its family's (the text before " ("), else the default; with ``key`` saying which entry
    answered. A row with ``applied: false`` (a fit kept as evidence, contradicted elsewhere) is skipped."""
    doc = efficiency_table()
    rows = doc.get("architectures") or {}
    arch = (architecture or "").strip()
    for key in (f"{arch} {segment}" if segment else "", arch, arch.split(" (")[0]):
        if key and key in rows and rows[key].get("applied", True):
            return {**doc["default"], **rows[key], "key": key}
    return {**doc["default"], "key": "default"}


def segment(row: Mapping[str, Any]) -> str | None:
    """A gpus.yaml row's market segment where it changes what the chip's kernels reach: "GeForce"."""
    return "GeForce" if str(row.get("name", "")).startswith("GeForce") else None


def moe_kernels(architecture: str | None) -> dict[str, Any] | None:
    """The routed experts' kernel shares relative to the dense ones for ``architecture``
    (gpu_efficiency.yaml's ``moe_kernels``: the exact entry, else its family), with ``key``; None
    where no measured table covers it (the experts then run at the dense share)."""
    rows = efficiency_table().get("moe_kernels") or {}
    arch = (architecture or "").strip()
    for key in (arch, arch.split(" (")[0]):
        if key and key in rows:
            return {**rows[key], "key": key}
    return None


# Dense FP16 tensor FLOPs one streaming multiprocessor does per clock at FP16 accumulate (the tensor
# cores' full rate), by compute capability: NVIDIA's architecture whitepapers (V100: 8 tensor cores x
# 64 FMA; Turing: 8 x 64; the GA10x/AD10x/GB20x chips: 4 x 128 FMA; GA100: 4 x 256; GH100: 4 x 512;
# GB100: 4 x 1024). The datasheet's FP16-accumulate rate over it is the card's SMs x boost clock: 312 TFLOPs /
# 2048 = 152 G SM-clocks/s for the A100 (108 SMs x 1.41 GHz), 142.3 / 1024 = 139 for the RTX 3090 (82 x
# 1.70), 989 / 4096 = 241 for the H100 SXM (132 x 1.83). A row whose rate does not identify its SMs'
# clocks says so (``sm_clock_ghz: null``: the H20, whose tensor cores are cut below GH100's; the A10G and
# L20, whose FP16-accumulate rate no NVIDIA datasheet gives).
TENSOR_FLOP_PER_SM_CLOCK = {
    "7.0": 1024,
    "7.5": 1024,
    "8.0": 2048,
    "8.6": 1024,
    "8.7": 1024,
    "8.9": 1024,
    "9.0": 4096,
    "10.0": 8192,
    "10.3": 8192,
    "12.0": 1024,
    "12.1": 1024,
}


def sm_clock_ghz(row: Mapping[str, Any]) -> float | None:
    """A gpus.yaml row's streaming multiprocessors x their boost clock, in G SM-clocks per second, from
    its FP16-accumulate tensor rate (:data:`TENSOR_FLOP_PER_SM_CLOCK`: the GeForce rows'
    ``fp16_tensor_tflops_dense_fp16acc``, elsewhere the dense rate, the same); None where either is unknown."""
    if "sm_clock_ghz" in row:  # the row says it (null: its tensor rate does not identify its SMs' clocks)
        return float(row["sm_clock_ghz"]) if row["sm_clock_ghz"] else None
    per_clock = TENSOR_FLOP_PER_SM_CLOCK.get(str(row.get("compute_capability") or ""))
    # the GeForce rows state the FP16-accumulate rate beside PyTorch's; elsewhere the two are the same
    rate = row.get("fp16_tensor_tflops_dense_fp16acc") or row.get("fp16_bf16_tensor_tflops_dense")
    if not per_clock or not rate:
        return None
    return float(rate) * 1e3 / per_clock
