"""The share of the dense BF16 datasheet that AIConfigurator's *measured* vLLM fused-MoE tables reach per GPU,
at the routed experts of four MoE models (TP 1, EP 1, balanced routing; power-law 1.01 where a table has no
balanced rows) and 2,048 / 8,192 tokens a step, and its ratio to the same GPU's dense GEMM share
(benchmarks/aic_gemm_share.py): the evidence behind hwprofile/data/gpu_efficiency.yaml's `moe_kernels` ratios
(docs/validation-serving.md).

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic && cd /tmp/aic && unzip -q *.whl
    python benchmarks/aic_moe_share.py /tmp/aic/aiconfigurator_core/systems/data

Needs pandas and pyarrow (not hwprofile's dependencies). A shape the table lacks is left out, not estimated.
"""

from __future__ import annotations

import argparse
import glob
import statistics
from pathlib import Path
from typing import Any

# datasheet dense BF16 TFLOPS (hwprofile/data/gpus.yaml's rows) and the dense GEMM share aic_gemm_share.py reads
PEAK = {"a100_sxm": 312.0, "h100_sxm": 989.4, "h200_sxm": 989.4, "l40s": 362.05}
DENSE = {"a100_sxm": 0.88, "h100_sxm": 0.76, "h200_sxm": 0.80, "l40s": 0.63}
# model: (hidden, one expert's intermediate, top k, experts, the checkpoint's MoE dtypes to read)
MODELS = {
    "gpt-oss-20b": (2880, 2880, 4, 32, ("w4a16_mxfp4",)),
    "Qwen3-30B-A3B": (2048, 768, 8, 128, ("bfloat16", "fp8", "fp8_block")),
    "Mixtral-8x7B": (4096, 14336, 2, 8, ("bfloat16", "fp8")),
    "DeepSeek-V3": (7168, 2048, 8, 256, ("fp8_block", "fp8", "bfloat16")),
}
TOKENS = (2048, 8192)


def shares(data: Path, system: str) -> list[tuple[str, str, int, str, float]]:
    """(model, dtype, tokens, kernel, share of the datasheet) per measured shape of one system's MoE table."""
    import pandas as pd

    files = sorted(glob.glob(str(data / system / "moe" / "vllm" / "*" / "moe_perf.parquet")))
    if not files:
        return []
    df: Any = pd.read_parquet(files[-1])
    df = df[(df.moe_tp_size == 1) & (df.moe_ep_size == 1)]
    # balanced routing where measured; the A100's table has only power-law routing (1.01: the mildest)
    df = df[df.distribution == ("balanced" if (df.distribution == "balanced").any() else "power_law_1.01")]
    out = []
    for name, (hidden, inter, topk, experts, dtypes) in MODELS.items():
        for dt in dtypes:
            for m in TOKENS:
                sel = df[
                    (df.hidden_size == hidden)
                    & (df.inter_size == inter)
                    & (df.topk == topk)
                    & (df.num_experts == experts)
                    & (df.moe_dtype == dt)
                    & (df.num_tokens == m)
                ]
                if sel.empty:
                    continue
                r = sel.loc[sel.latency.idxmin()]  # the fastest kernel vLLM has for it
                flops = 2 * m * topk * 3 * hidden * inter
                share = flops / (float(r.latency) / 1e3) / 1e12 / PEAK[system]
                out.append((name, dt, m, str(r.kernel_source), share))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="aiconfigurator_core/systems/data")
    args = ap.parse_args(argv)
    for system in PEAK:
        rows = shares(args.data, system)
        if not rows:
            print(f"{system}: no vLLM MoE table")
            continue
        for name, dt, m, kernel, share in rows:
            print(
                f"{system:9} {name:14} {dt:12} {m:5} {share:6.1%}  x{share / DENSE[system]:.2f} of dense  {kernel}"
            )
        ratios = [s / DENSE[system] for *_, s in rows]
        print(
            f"{system}: median {statistics.median(ratios):.2f} of the dense share "
            f"({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} shapes)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
