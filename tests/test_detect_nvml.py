"""Detection through the real pynvml code against the fake libnvidia-ml.so.1, per fixture host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import FAKE_SOURCE, MIB, build, fixture_names, gpus_of, load_spec, nvml_include_dir
from system import need

from hwprofile.host.detect import detect_host
from hwprofile.host.snapshot_io import snapshot_from_dict

GPU_HOSTS = [n for n in fixture_names() if gpus_of(load_spec(n))]


@pytest.mark.parametrize("name", GPU_HOSTS)
def test_fixture_host_is_detected_as_described(name: str, fake_host) -> None:
    host = fake_host(name)
    spec = host.spec
    snap = detect_host()
    gpus = gpus_of(spec)

    assert snap.hostname == spec["hostname"]
    assert snap.kernel == spec["kernel"]
    assert snap.cpu.model == spec["cpu"]["model"]
    assert snap.cpu.sockets == len(spec["numa"])
    assert [n.cpus for n in snap.numa_nodes] == [n["cpus"] for n in spec["numa"]]
    assert snap.memory_bytes == sum(n["memory_gib"] for n in spec["numa"]) * 2**30
    assert snap.driver.version == spec["driver"]["version"]
    cuda = spec["driver"]["cuda"]
    assert snap.driver.cuda_version == f"{cuda // 1000}.{cuda % 1000 // 10}"
    assert len(snap.gpus) == len(gpus)

    for g, want in zip(snap.gpus, gpus, strict=True):
        if want.get("lost"):
            assert g.lost and g.name is None
            continue
        assert g.name == want["name"]
        assert g.memory_total_bytes == want["memory_mib"] * MIB
        assert g.compute_capability == want["cc"]
        assert g.pci_bus_id.lower() == want["bus"].lower()
        expected_node = want["numa"] if want["numa"] >= 0 else (0 if len(spec["numa"]) == 1 else None)
        assert g.numa_node == expected_node
        assert g.numa_node_source == (
            ("nvml" if spec["numa_source"] == "nvml" else "sysfs") if want["numa"] >= 0 else "only_node"
        )
        if want["numa"] >= 0:
            assert g.cpu_affinity == spec["numa"][want["numa"]]["cpus"]
        gen, width, max_gen, max_width = want["pcie"]
        assert (g.pcie.gen, g.pcie.width, g.pcie.max_gen, g.pcie.max_width) == (
            gen,
            width,
            max_gen,
            max_width,
        )
        assert g.pcie.degraded == (width < max_width or gen < max_gen)
        assert g.nvlink_active_links == want.get("nvlink", 0)
        assert g.power_limit_watts == want["power_limit_w"]
        assert (g.temperature_c, g.temperature_slowdown_c, g.temperature_shutdown_c) == (
            want["temperature"],
            want["slowdown"],
            want["shutdown"],
        )
        assert (g.sm_clock_mhz, g.sm_clock_max_mhz) == (want["sm_clock"], want["sm_clock_max"])
        assert g.clocks_event_reasons_mask == want.get("clocks_event_reasons", 0)

    usable = [i for i, w in enumerate(gpus) if not w.get("lost")]
    assert len(snap.gpu_links) == len(usable) * (len(usable) - 1) // 2
    for lk in snap.gpu_links:
        want_nv = min(gpus[lk.a].get("nvlink", 0), gpus[lk.b].get("nvlink", 0))
        if want_nv:
            assert lk.link == f"NV{want_nv}"
        else:
            topo = dict(spec.get("topology") or {})
            assert lk.link == topo.get(f"{lk.a}-{lk.b}", topo.get("default"))
        p2p = dict(spec.get("p2p") or {})
        assert lk.p2p == (p2p.get(f"{lk.a}-{lk.b}", p2p.get("default", 0)) == 0)

    lost = [i for i, w in enumerate(gpus) if w.get("lost")]
    assert [e.where for e in snap.errors] == [f"gpu[{i}]" for i in lost]


def test_json_round_trip_is_lossless(fake_host) -> None:
    fake_host("a800-pcie-4x-2numa")
    snap = detect_host()
    again = snapshot_from_dict(json.loads(snap.to_json()))
    assert again == snap
    data = snap.to_dict()
    assert data["schema"] == "hwprofile.host/1"
    for key in (
        "hostname",
        "kernel",
        "cpu",
        "memory_bytes",
        "numa_nodes",
        "gpus",
        "gpu_links",
        "driver",
        "software",
        "errors",
    ):
        assert key in data
    gpu_keys = {
        "index",
        "name",
        "uuid",
        "pci_bus_id",
        "memory_total_bytes",
        "compute_capability",
        "numa_node",
        "cpu_affinity",
        "pcie",
        "nvlink_active_links",
        "power_limit_watts",
        "temperature_c",
        "temperature_slowdown_c",
        "temperature_shutdown_c",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "clocks_event_reasons",
    }
    assert gpu_keys <= set(data["gpus"][0])
    assert {"gen", "width", "max_gen", "max_width"} <= set(data["gpus"][0]["pcie"])
    assert {"vllm_version", "numactl_path", "tmpfs_path", "tmpfs_free_bytes"} <= set(data["software"])


def test_unsupported_field_is_none_with_reason(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    host.set_state(**{"dev0.err.nvmlDeviceGetTemperatureThreshold": 3})  # NOT_SUPPORTED
    snap = detect_host()
    g = snap.gpus[0]
    assert g.temperature_slowdown_c is None and g.temperature_shutdown_c is None
    assert g.temperature_c == 41  # the rest is still read
    wheres = {e.where: e.message for e in snap.errors}
    assert "Not Supported" in wheres["gpu[0].temperature_slowdown"]
    assert "nvmlDeviceGetTemperatureThreshold" in wheres["gpu[0].temperature_shutdown"]


def test_older_driver_function_names_are_used(fake_host) -> None:
    # A driver older than 535 has no ...ClocksEventReasons: the ...ThrottleReasons name is used.
    host = fake_host("rtx3090-2x")
    host.set_state(**{"err.nvmlDeviceGetCurrentClocksEventReasons": 13})  # FUNCTION_NOT_FOUND
    snap = detect_host()
    assert snap.gpus[1].clocks_event_reasons == ("sw_thermal_slowdown",)
    assert not snap.errors


def test_numa_from_sysfs_when_nvml_lacks_it(fake_host) -> None:
    host = fake_host("h100-sxm-8x")  # the driver answers NUMA itself...
    assert detect_host().gpus[5].numa_node_source == "nvml"
    host.set_state(**{"err.nvmlDeviceGetNumaNodeId": 3})  # ...until it does not
    snap = detect_host()
    assert [g.numa_node for g in snap.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.numa_node_source for g in snap.gpus} == {"sysfs"}


def test_gpu_lost_midway_degrades_the_snapshot(fake_host) -> None:
    host = fake_host("a800-pcie-4x-2numa")
    host.set_state(**{"dev2.err.nvmlDeviceGetPowerUsage": 15})  # GPU_IS_LOST on a later call
    snap = detect_host()
    assert [g.lost for g in snap.gpus] == [False, False, True, False]
    assert [g.index for g in snap.usable_gpus] == [0, 1, 3]
    assert all(2 not in (lk.a, lk.b) for lk in snap.gpu_links)
    assert [e.where for e in snap.errors] == ["gpu[2]"]


def test_driver_not_loaded_is_an_error_not_a_crash(fake_host) -> None:
    fake_host("no-driver")
    snap = detect_host()
    assert snap.gpus == ()
    assert snap.errors[0].where == "nvml"
    assert "driver is not loaded" in snap.errors[0].message
    assert snap.cpu.logical_cpus == 16


def test_system_call_failure_keeps_devices(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    host.set_state(**{"err.nvmlSystemGetDriverVersion": 999})
    snap = detect_host()
    assert snap.driver.version is None and snap.driver.cuda_version == "12.4"
    assert snap.gpus[0].name == "NVIDIA GeForce RTX 4090"
    assert [e.where for e in snap.errors] == ["driver.version"]


# -- whole-process runs: the library found by its soname, as on a real host -----------------


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env.items() if k != "HWPROFILE_NVML_LIBRARY"}
    return subprocess.run([sys.executable, "-m", "hwprofile", *args], env=env, capture_output=True, text=True)


def test_no_library_at_all(tmp_path: Path) -> None:
    host = build("no-driver", tmp_path / "h")
    env = host.env(None)
    env.pop("LD_LIBRARY_PATH", None)
    r = _run(["detect", "--json"], env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["gpus"] == [] and data["driver"]["version"] is None
    assert "libnvidia-ml.so.1 not found" in data["errors"][0]["message"]


def test_cli_human_view(tmp_path: Path, fake_nvml_dir: Path) -> None:
    host = build("rtx3090-2x", tmp_path / "h")
    r = _run(["detect"], host.env(fake_nvml_dir))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "GPUs (2 usable of 2)" in out
    assert "Gen4 x8 (max Gen4 x16) BELOW MAX" in out
    assert "warning: PCIe link below its maximum on GPU 1" in out
    assert "sw_thermal_slowdown" in out
    assert "71 C (93/98)" in out
    assert "node 0: CPUs 0-31, memory 128.0 GiB, GPUs 0,1" in out
    lost = build("gpu-lost-2x", tmp_path / "lost")
    out = _run(["detect"], lost.env(fake_nvml_dir)).stdout
    assert "GPUs (1 usable of 2)" in out and "LOST" in out
    assert "gpu[1]: GPU is lost" in out


def test_replay_from_saved_snapshot(tmp_path: Path, fake_nvml_dir: Path) -> None:
    host = build("a800-pcie-4x-2numa", tmp_path / "h")
    saved = _run(["detect", "--json"], host.env(fake_nvml_dir))
    path = tmp_path / "snap.json"
    path.write_text(saved.stdout)
    env = {k: v for k, v in host.env(None).items() if not k.startswith(("FAKE_", "HWPROFILE_"))}
    replay = _run(["detect", "--json", "--from", str(path)], env)
    assert replay.returncode == 0
    assert json.loads(replay.stdout) == json.loads(saved.stdout)
    human_live = _run(["detect"], host.env(fake_nvml_dir)).stdout
    assert _run(["detect", "--from", str(path)], env).stdout == human_live


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "snap.json:1:2: invalid JSON"),
        ('{"schema": "other/9"}', "schema is 'other/9'"),
        ('{"schema": "hwprofile.host/1", "gpus": [{"name": "x"}]}', "not a valid host snapshot"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_snapshot_file_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "snap.json"
    path.write_text(content)
    r = _run(["detect", "--from", str(path)], {"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    missing = _run(["detect", "--from", str(tmp_path / "nope.json")], {"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "cannot read snapshot" in missing.stderr


def test_detect_path_imports_no_heavy_modules(tmp_path: Path, fake_nvml_dir: Path) -> None:
    host = build("h100-sxm-8x", tmp_path / "h")
    # pathlib costs 5-15 ms to import on small VMs (detect has a 100 ms budget; typing is used);
    # only what hwprofile itself adds counts (an editable install's finder imports pathlib first).
    # logging: only the daemon and launch write a log (runtime.files imports it for the own log only)
    code = (
        "import sys, io, contextlib\n"
        "before = set(sys.modules)\n"
        "from hwprofile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['detect', '--json'])\n"
        "heavy = ('vllm', 'torch', 'jinja2', 'yaml', 'watchdog', 'cpuinfo', 'pathlib', 'logging')\n"
        "print(sorted(m for m in heavy if m in set(sys.modules) - before))\n"
    )
    env = {k: v for k, v in host.env(fake_nvml_dir).items() if k != "HWPROFILE_NVML_LIBRARY"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_memory_v1_on_drivers_without_v2(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    v2 = detect_host().gpus[0]
    assert v2.memory_used_bytes == 5 * MIB and v2.memory_reserved_bytes == 300 * MIB
    host.set_state(**{"err.nvmlDeviceGetMemoryInfo_v2": 13})
    snap = detect_host()
    v1 = snap.gpus[0]
    assert v1.memory_total_bytes == v2.memory_total_bytes
    # v1 folds the reservation into used and does not say it: not read (None), never 0
    assert v1.memory_used_bytes == 305 * MIB and v1.memory_reserved_bytes is None
    assert v2.cuda_total_bytes == v2.memory_total_bytes - 300 * MIB and v1.cuda_total_bytes is None
    assert not snap.errors


def test_a_library_that_crashes_in_init_is_said_not_fatal(tmp_path) -> None:
    """An HWPROFILE_NVML_LIBRARY that crashes in nvmlInit killed `detect` with SIGSEGV and no word:
    it is tried in a child first, and detect says why it was not used (exit 0, no GPUs)."""
    src = tmp_path / "crash.c"
    src.write_text(
        "int nvmlInitWithFlags(unsigned f) { (void)f; *(volatile int *)0 = 1; return 0; }\n"
        "int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }\n"
    )
    lib = tmp_path / "libcrash.so"
    subprocess.run([need("gcc"), "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "detect", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "HWPROFILE_NVML_LIBRARY": str(lib)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["gpus"] == [] and any("crashed in nvmlInit (SIGSEGV" in e["message"] for e in doc["errors"]), (
        doc["errors"]
    )


def test_a_library_with_another_soname_is_not_reported_as_used(tmp_path, fake_nvml_dir, fake_host) -> None:
    """pynvml opens libnvidia-ml.so.1 by name: a library of another soname named by
    HWPROFILE_NVML_LIBRARY is loaded beside it but not used. Detect says which one answered."""
    host = fake_host("rtx4090-1x")
    other = tmp_path / "libnvidia-ml-custom.so"
    subprocess.run(
        [
            need("gcc"),
            "-O1",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libnvidia-ml-custom.so",
            "-Wno-deprecated-declarations",
            f"-I{nvml_include_dir()}",
            "-o",
            str(other),
            str(FAKE_SOURCE),
        ],
        check=True,
    )
    env = {
        **host.env(fake_nvml_dir),
        "HWPROFILE_NVML_LIBRARY": str(other),
        "LD_LIBRARY_PATH": str(fake_nvml_dir),
    }  # the default libnvidia-ml.so.1 is the fake in the test's dir
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "detect", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    doc = json.loads(r.stdout)
    assert doc["driver"]["nvml_library"] == str(fake_nvml_dir / "libnvidia-ml.so.1"), doc["driver"]
    assert any("is not what pynvml uses" in e["message"] for e in doc["errors"]), doc["errors"]
