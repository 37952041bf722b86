"""Device minor numbers (issue 9): ``/dev/nvidiaN`` is named after the GPU's device minor, which need
not be its NVML index. Detection reads the minor through NVML, the snapshot carries it
(``minor_number``, optional in ``hwprofile.host/1``), the plan instance lists its GPUs' minors
(``gpu_minors``) and the systemd unit allows exactly those device nodes; when a minor is unknown the
unit allows the driver's device group (``char-nvidia…``), never ``/dev/nvidia<index>``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from system import analyze_verify, need

from hwprofile.host.detect import detect_host
from hwprofile.host.snapshot import SnapshotError
from hwprofile.host.snapshot_io import load_snapshot, snapshot_from_dict
from hwprofile.pipeline import make_plan
from hwprofile.render.output import NVIDIA_CONTROL_DEVICES, NVIDIA_DEVICE_GROUPS, device_allow, render
from hwprofile.render.translate import render_instance
from hwprofile.render.versions import release

HERE = Path(__file__).resolve().parent
SCHEMA_FILE = HERE.parent / "schemas" / "hwprofile.host-1.schema.json"
HOST = "a800-pcie-4x-minors"  # NVML indexes 0-3 are /dev/nvidia2, 3, 0, 1
MINORS = [2, 3, 0, 1]
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
CONTROL = {f"DeviceAllow={d} rw" for d in NVIDIA_CONTROL_DEVICES}
GROUPS = {f"DeviceAllow={g} rw" for g in NVIDIA_DEVICE_GROUPS}


def _device_lines(unit: str) -> set[str]:
    lines = [line for line in unit.splitlines() if line.startswith("DeviceAllow=")]
    assert len(lines) == len(set(lines)), lines
    return set(lines)


def _gpu_nodes(lines: set[str]) -> set[str]:
    return {m.group(1) for line in lines if (m := re.fullmatch(r"DeviceAllow=(/dev/nvidia\d+) rw", line))}


def _units(plan: dict[str, Any]) -> dict[str, str]:
    from hwprofile.plan.types import Plan

    typed = Plan.from_json(plan)  # the plan read back from its JSON, as a launch file is
    out = {}
    for inst in typed.instances:
        r = render_instance(typed, inst, release("0.33.0"), "vllm", "/usr/bin/numactl")
        out[inst.name] = render(r, "systemd", typed, inst)
    return out


def _cli(args: list[str], env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", *args], env=env, input=stdin, capture_output=True, text=True
    )


@pytest.fixture
def cli_env(tmp_path, fake_nvml_dir, empty_root):
    from fakehost import build

    def make(name: str) -> dict[str, str]:
        host = build(name, tmp_path / name)
        return {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}

    return make


# -- detection ---------------------------------------------------------------------------------


def test_detect_reads_the_minor_numbers_not_the_indexes(fake_host) -> None:
    fake_host(HOST)
    snap = detect_host()
    assert [g.index for g in snap.gpus] == [0, 1, 2, 3]
    assert [g.minor_number for g in snap.gpus] == MINORS
    assert not [e for e in snap.errors if "minor" in e.where]
    again = snapshot_from_dict(json.loads(snap.to_json()))
    assert [g.minor_number for g in again.gpus] == MINORS


def test_fixture_builder_and_set_state_set_the_minor(fake_host) -> None:
    host = fake_host("rtx3090-2x")
    assert [g.minor_number for g in detect_host().gpus] == [0, 1]  # the fake's default: the index
    host.set_state(dev0__minor=7, dev1__minor=4)
    assert [g.minor_number for g in detect_host().gpus] == [7, 4]


def test_unsupported_or_bad_minor_is_unknown_and_recorded(fake_host) -> None:
    host = fake_host(HOST)
    host.set_state(**{"dev1.err.nvmlDeviceGetMinorNumber": NOT_SUPPORTED, "dev3.minor": 300})
    snap = detect_host()
    assert [g.minor_number for g in snap.gpus] == [2, None, 0, None]  # never the index instead
    where = {e.where: e.message for e in snap.errors}
    assert "Not Supported" in where["gpu[1].minor_number"]
    assert "300 is not a device minor" in where["gpu[3].minor_number"]
    snapshot_from_dict(json.loads(snap.to_json()))  # still a valid snapshot


def test_driver_without_the_function_is_unknown(fake_host, monkeypatch) -> None:
    fake_host(HOST)
    import pynvml

    monkeypatch.delattr(pynvml, "nvmlDeviceGetMinorNumber")
    snap = detect_host()
    assert all(g.minor_number is None for g in snap.gpus)
    assert "gpu[0].minor_number" in {e.where for e in snap.errors}


def test_detect_json_validates_against_the_schema_file(cli_env) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    r = _cli(["detect", "--json"], cli_env(HOST))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [g["minor_number"] for g in out["gpus"]] == MINORS
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema["properties"]["gpus"]["items"]["properties"]["minor_number"] == {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": 255,
    }
    assert "minor_number" not in schema["properties"]["gpus"]["items"]["required"]
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(out)]
    assert not errors, errors


# -- the snapshot contract -----------------------------------------------------------------------


def _snapshot(fake_host) -> dict[str, Any]:
    fake_host(HOST)
    return json.loads(detect_host().to_json())


@pytest.mark.parametrize("bad", [-1, 256, 2.0, "2", True])
def test_minor_out_of_range_is_refused(fake_host, bad) -> None:
    data = _snapshot(fake_host)
    data["gpus"][1]["minor_number"] = bad
    with pytest.raises(SnapshotError, match=r"gpus\[1\]\.minor_number: expected an integer from 0 to 255"):
        snapshot_from_dict(data)


def test_two_gpus_with_one_minor_are_refused(fake_host) -> None:
    data = _snapshot(fake_host)
    data["gpus"][3]["minor_number"] = 2
    with pytest.raises(SnapshotError, match=r"gpus\[3\]\.minor_number: device minor 2 is also GPU 0's"):
        snapshot_from_dict(data)
    data["gpus"][3]["minor_number"] = None  # unknown twice is fine
    data["gpus"][2]["minor_number"] = None
    snapshot_from_dict(data)


def test_old_snapshot_without_minor_number_loads() -> None:
    base = json.loads((HERE / "hostile" / "host-base.json").read_text())
    assert base["gpus"] and all("minor_number" not in g for g in base["gpus"])
    snap = snapshot_from_dict(base)
    assert all(g.minor_number is None for g in snap.gpus)


# -- plan and unit -------------------------------------------------------------------------------


def test_plan_carries_the_minors_and_the_unit_allows_exactly_them(fake_host, empty_root) -> None:
    fake_host(HOST)
    plan = make_plan(detect_host(), empty_root, sets=["server.vllm_command=vllm"], environ={}).to_json()
    insts = {i["name"]: i for i in plan["instances"]}
    assert insts, plan
    for inst in insts.values():
        assert inst["gpu_minors"] == [MINORS[g] for g in inst["gpus"]]
    units = _units(plan)
    for name, unit in units.items():
        lines = _device_lines(unit)
        want = {f"/dev/nvidia{MINORS[g]}" for g in insts[name]["gpus"]}
        assert _gpu_nodes(lines) == want, (name, lines)
        assert lines == CONTROL | {f"DeviceAllow={d} rw" for d in want}, (name, lines)
        assert "DevicePolicy=closed" in unit
    # discriminating: some instance's device nodes are not /dev/nvidia<its indexes>
    assert any(
        {f"/dev/nvidia{g}" for g in i["gpus"]} != _gpu_nodes(_device_lines(units[n]))
        for n, i in insts.items()
    )


def test_old_snapshot_plans_with_the_device_group_fallback(fake_host, empty_root, tmp_path) -> None:
    data = _snapshot(fake_host)
    for g in data["gpus"]:
        del g["minor_number"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    plan = make_plan(load_snapshot(path), empty_root, sets=["server.vllm_command=vllm"], environ={}).to_json()
    assert plan["instances"] and all(i["gpu_minors"] == [None] * len(i["gpus"]) for i in plan["instances"])
    for name, unit in _units(plan).items():
        lines = _device_lines(unit)
        assert lines == CONTROL | GROUPS, (name, lines)
        assert not _gpu_nodes(lines), "the NVML index is never used as a device minor"


def test_one_unknown_minor_falls_back_for_the_instance(fake_host, empty_root) -> None:
    host = fake_host(HOST)
    host.set_state(**{"dev1.err.nvmlDeviceGetMinorNumber": NOT_SUPPORTED})
    plan = make_plan(detect_host(), empty_root, sets=["server.vllm_command=vllm"], environ={}).to_json()
    units = _units(plan)
    for inst in plan["instances"]:
        lines = _device_lines(units[inst["name"]])
        if 1 in inst["gpus"]:
            assert lines == CONTROL | GROUPS
        else:
            assert _gpu_nodes(lines) == {f"/dev/nvidia{MINORS[g]}" for g in inst["gpus"]}


def test_cpu_instance_allows_no_nvidia_device(cli_env) -> None:
    r = _cli(
        ["render", "--format", "systemd", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "0.33.0"],
        cli_env("no-driver"),
    )
    assert r.returncode == 0, r.stderr
    assert "nvidia" not in r.stdout


@pytest.mark.parametrize(
    ("minors", "gpus", "gpu_entries"),
    [
        ([5, 9], 2, ["/dev/nvidia5", "/dev/nvidia9"]),
        ([0], 1, ["/dev/nvidia0"]),
        (None, 2, list(NVIDIA_DEVICE_GROUPS)),  # a plan from before gpu_minors
        ([5], 2, list(NVIDIA_DEVICE_GROUPS)),  # does not match the instance's GPUs
        ([5, None], 2, list(NVIDIA_DEVICE_GROUPS)),
        ([True, 1], 2, list(NVIDIA_DEVICE_GROUPS)),
        ([256, 1], 2, list(NVIDIA_DEVICE_GROUPS)),
        (["1", 2], 2, list(NVIDIA_DEVICE_GROUPS)),
    ],
)
def test_device_allow(minors, gpus, gpu_entries) -> None:
    assert device_allow(minors, gpus) == [*NVIDIA_CONTROL_DEVICES, *gpu_entries]
    assert "/dev/nvidia-modeset" not in device_allow(minors, gpus)


# -- systemd accepts both forms ------------------------------------------------------------------


def _verify(env: dict[str, str], tmp_path: Path, extra: list[str]) -> list[Path]:
    envfile = tmp_path / "inst.env"
    envfile.write_text("VLLM_NO_USAGE_STATS=1\n")
    vllm = Path(sys.executable).parent / "vllm"
    exe = str(vllm if vllm.exists() else Path(sys.executable))
    out = tmp_path / "units"
    args = ["render", "--vllm-version", "0.33.0", "--format", "systemd", "--env-file", str(envfile)]
    args += ["--set", f"server.vllm_command={exe}", "--output", str(out), *extra]
    r = _cli(args, env)
    assert r.returncode == 0, r.stderr
    units = sorted(out.glob("*.service"))
    assert units
    for unit in units:
        v = analyze_verify(unit)
        assert v.returncode == 0 and v.stderr == "", (unit.read_text(), v.stderr)
        sec = subprocess.run(
            [need("systemd-analyze"), "security", "--offline=true", str(unit)], capture_output=True, text=True
        )
        m = re.search(r"Overall exposure level for .*: ([\d.]+)", sec.stdout)
        assert m and float(m.group(1)) <= 4.0, sec.stdout[-3000:]
    return units


def test_units_with_minors_pass_systemd_analyze(cli_env, tmp_path) -> None:
    units = _verify(cli_env(HOST), tmp_path, [])
    nodes = {u.stem: _gpu_nodes(_device_lines(u.read_text())) for u in units}
    assert set().union(*nodes.values()) == {f"/dev/nvidia{m}" for m in MINORS}, nodes


def test_fallback_units_pass_systemd_analyze(cli_env, tmp_path, fake_host) -> None:
    data = _snapshot(fake_host)
    for g in data["gpus"]:
        del g["minor_number"]
    snap = tmp_path / "old.json"
    snap.write_text(json.dumps(data))
    units = _verify(cli_env(HOST), tmp_path, ["--from", str(snap)])
    for u in units:
        assert _device_lines(u.read_text()) == CONTROL | GROUPS
