"""Parsers take text (procfs/sysfs formats) and return data."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwprofile.host import linux


def test_cpulist_round_trip_examples() -> None:
    assert linux.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert linux.parse_cpulist("") == []
    assert linux.format_cpulist([8, 0, 1, 2, 3, 3, 10, 11]) == "0-3,8,10-11"
    assert linux.format_cpulist([]) == ""


@given(st.sets(st.integers(min_value=0, max_value=511)))
def test_cpulist_round_trip_property(cpus: set[int]) -> None:
    assert linux.parse_cpulist(linux.format_cpulist(cpus)) == sorted(cpus)


def test_cpulist_from_nvml_masks() -> None:
    # CPUs 0-1 and 64-65: NVML's cpuSet is an array of 64-bit words.
    assert linux.cpulist_from_masks([0b11, 0b11]) == "0-1,64-65"
    assert linux.cpulist_from_masks([0, 0]) == ""


X86 = """processor\t: 0
model name\t: AMD EPYC 7543 32-Core Processor
physical id\t: 0
flags\t\t: fpu sse4_2 avx2

processor\t: 1
model name\t: AMD EPYC 7543 32-Core Processor
physical id\t: 1
flags\t\t: fpu sse4_2 avx2
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve
CPU implementer\t: 0x41

processor\t: 1
Features\t: fp asimd evtstrm aes sve
"""


def test_parse_cpuinfo_x86_two_sockets() -> None:
    cpu = linux.parse_cpuinfo(X86)
    assert cpu.model == "AMD EPYC 7543 32-Core Processor"
    assert (cpu.logical_cpus, cpu.sockets) == (2, 2)
    assert cpu.flags == ("fpu", "sse4_2", "avx2")


def test_parse_cpuinfo_arm_has_no_model_name() -> None:
    cpu = linux.parse_cpuinfo(ARM)
    assert cpu.model is None
    assert (cpu.logical_cpus, cpu.sockets) == (2, 1)
    assert "sve" in cpu.flags


def test_parse_meminfo_and_mounts() -> None:
    assert linux.parse_meminfo_total("MemTotal:       24576000 kB\n") == 24576000 * 1024
    assert linux.parse_meminfo_total("Node 1 MemTotal:  1024 kB\n") == 1024 * 1024
    assert linux.parse_meminfo_total("nothing") is None
    mounts = "proc /proc proc rw 0 0\nshm /dev/shm tmpfs rw 0 0\n"
    assert linux.parse_mounts_fstype(mounts, "/dev/shm") == "tmpfs"
    assert linux.parse_mounts_fstype(mounts, "/run") is None


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:17:00.0", "0000:17:00.0"),
        ("00000000:B1:00.0", "0000:b1:00.0"),
        ("0000:01:00.0", "0000:01:00.0"),
    ],
)
def test_sysfs_pci_name(nvml: str, sysfs: str) -> None:
    assert linux.sysfs_pci_name(nvml) == sysfs


def test_readers_report_missing_trees(tmp_path) -> None:
    errors: list = []
    assert linux.read_numa_nodes(tmp_path, errors) == ()
    assert linux.read_memory(tmp_path, errors) is None
    assert [e.where for e in errors] == ["numa", "memory"]
    # sysfs numa_node of -1 means unknown.
    d = tmp_path / "bus" / "pci" / "devices" / "0000:17:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("-1\n")
    assert linux.read_pci_numa_node(tmp_path, "00000000:17:00.0") is None
    (d / "numa_node").write_text("1\n")
    assert linux.read_pci_numa_node(tmp_path, "00000000:17:00.0") == 1
