"""The share of the dense BF16 datasheet that AIConfigurator's *measured* vLLM GEMM tables reach per GPU, at
the linear layers of four dense models (Llama-3-8B, Qwen3-14B, Qwen3-32B, Llama-3-70B; TP 1) and 512, 2,048
and 8,192 tokens a step: the kernel-level evidence behind hwprofile/data/gpu_efficiency.yaml's Hopper row
(docs/validation-serving.md).

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic && cd /tmp/aic && unzip -q *.whl
    python benchmarks/aic_gemm_share.py /tmp/aic/aiconfigurator_core/systems/data

Needs pandas and pyarrow (not hwprofile's dependencies: run it from any environment that has them). Each
shape's latency is the table's nearest measured shape (log distance over m, n, k) scaled by the FLOPs ratio.
"""

from __future__ import annotations

import argparse
import glob
import math
import statistics
from pathlib import Path
from typing import Any

# datasheet dense BF16 TFLOPS (hwprofile/data/gpus.yaml's rows)
PEAK = {"a100_sxm": 312.0, "h100_sxm": 989.4, "h200_sxm": 989.4, "l40s": 362.05}
# hidden, q+k+v width, intermediate, o_proj input width
MODELS = {
    "Llama-3-8B": (4096, 6144, 14336, 4096),
    "Qwen3-14B": (5120, 7168, 17408, 5120),
    "Qwen3-32B": (5120, 10240, 25600, 8192),
    "Llama-3-70B": (8192, 10240, 28672, 8192),
}
TOKENS = (512, 2048, 8192)


def latency_ms(rows: Any, m: int, n: int, k: int) -> float:
    """The nearest measured shape's latency, scaled to (m, n, k) by FLOPs."""
    dist = (rows.m / m).map(math.log) ** 2 + (rows.n / n).map(math.log) ** 2 + (rows.k / k).map(math.log) ** 2
    r = rows.loc[dist.idxmin()]
    return float(r.latency) * (m * n * k) / (float(r.m) * float(r.n) * float(r.k))


def shares(data: Path, system: str) -> tuple[str, list[float]] | None:
    """(table version, share of the datasheet per model x tokens) of one system's bf16 vLLM GEMM table."""
    import pandas as pd

    files = sorted(glob.glob(str(data / system / "gemm" / "vllm" / "*" / "gemm_perf.parquet")))
    if not files:
        return None
    df = pd.read_parquet(files[-1])
    rows = df[df.gemm_dtype == "bfloat16"]
    out = []
    for hidden, qkv, inter, o_in in MODELS.values():
        for m in TOKENS:
            shapes = [(m, qkv, hidden), (m, hidden, o_in), (m, 2 * inter, hidden), (m, hidden, inter)]
            ms = sum(latency_ms(rows, *s) for s in shapes)
            flops = sum(2 * a * b * c for a, b, c in shapes)
            out.append(flops / (ms / 1e3) / 1e12 / PEAK[system])
    return Path(files[-1]).parent.name, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="aiconfigurator_core/systems/data")
    args = ap.parse_args(argv)
    for system in PEAK:
        got = shares(args.data, system)
        if got is None:
            print(f"{system}: no vLLM GEMM table")
            continue
        version, s = got
        print(
            f"{system} (vLLM {version} table): bf16 GEMM share of {PEAK[system]:g} TFLOPS, {len(s)} shapes: "
            f"median {statistics.median(s):.2f}, {min(s):.2f}-{max(s):.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
