"""The fake libnvidia-ml.so.1 is faithful enough that a real NVML client, gpustat, reads the same
devices from it as hwprofile does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import build

HOSTS = ["a800-pcie-4x-2numa", "rtx3090-2x", "h100-sxm-8x", "rtx4070-12g-1x"]


def _json(cmd: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", HOSTS)
def test_gpustat_sees_what_hwprofile_sees(name: str, tmp_path: Path, fake_nvml_dir: Path) -> None:
    host = build(name, tmp_path / name)
    env = host.env(fake_nvml_dir)
    ours = _json([sys.executable, "-m", "hwprofile", "detect", "--json"], env)
    theirs = _json([sys.executable, "-m", "gpustat", "--json"], env)

    assert theirs["driver_version"] == ours["driver"]["version"]
    assert len(theirs["gpus"]) == len(ours["gpus"]) > 0
    for g, o in zip(theirs["gpus"], ours["gpus"], strict=True):
        assert g["index"] == o["index"]
        assert g["name"] == o["name"]
        assert g["uuid"] == o["uuid"]
        assert g["memory.total"] == o["memory_total_bytes"] // 2**20
        assert g["memory.used"] == o["memory_used_bytes"] // 2**20
        assert g["temperature.gpu"] == o["temperature_c"]
        assert g["enforced.power.limit"] == o["power_limit_watts"]
        assert g["power.draw"] == o["power_draw_watts"]
        assert g["processes"] == []


def test_gpustat_reports_the_lost_gpu(tmp_path: Path, fake_nvml_dir: Path) -> None:
    host = build("gpu-lost-2x", tmp_path / "lost")
    r = subprocess.run(
        [sys.executable, "-m", "gpustat", "--no-color"],
        env=host.env(fake_nvml_dir),
        capture_output=True,
        text=True,
    )
    assert "((GPU is lost))" in r.stdout + r.stderr
    # and hwprofile, through the same fake, reports the same GPU lost (not a crash, not a guess)
    d = subprocess.run(
        [sys.executable, "-m", "hwprofile", "detect", "--json"],
        env=host.env(fake_nvml_dir),
        capture_output=True,
        text=True,
    )
    assert d.returncode == 0, d.stderr
    lost = [g["index"] for g in json.loads(d.stdout)["gpus"] if g["lost"]]
    assert lost == [1]  # the fixture's second board, the one gpustat marks lost too
