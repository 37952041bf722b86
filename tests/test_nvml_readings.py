"""``Nvml.live()`` and ``Nvml.faults()`` as typed readings (issue 34): each value an int (or bool), or
None with its reason, read through pynvml's real path from the fake libnvidia-ml (tests/fakenvml)."""

from __future__ import annotations

import pytest

from hwprofile.host.nvml import NOT_SUPPORTED, FaultCounters, LiveReadings, Nvml


def _open() -> Nvml:
    n = Nvml()
    n.open()
    return n


def test_live_readings_are_typed_values_of_the_fake_state(fake_host) -> None:
    host = fake_host("rtx4090-1x")
    host.set_state(**{"dev0.temperature": 71, "dev0.sm_clock": 2235, "dev0.margin_temperature": 12})
    n = _open()
    try:
        v = n.live(0, n.handle(0))
    finally:
        n.close()
    assert isinstance(v, LiveReadings)
    assert (v.temperature, v.sm_clock, v.margin) == (71, 2235, 12)
    for name in v._fields:
        if name != "why":
            assert type(getattr(v, name)) is int, name
    assert v.why == {} and n.errors == []
    with pytest.raises(AttributeError):  # immutable, like the snapshot's records
        v.temperature = 0  # type: ignore[misc]


def test_a_value_nvml_cannot_give_is_none_with_its_reason(fake_host) -> None:
    host = fake_host("a100-80g-pcie-1x")  # no temperature margin on this board (before Ada)
    host.set_state(**{"err.nvmlDeviceGetPowerUsage": 999})
    n = _open()
    try:
        h = n.handle(0)
        v = n.live(0, h)
        unasked = n.live(0, h, margin=False)
    finally:
        n.close()
    assert v.power_draw is None and "nvmlDeviceGetPowerUsage" in v.why["power_draw"]
    assert v.margin is None and v.why["margin"] == NOT_SUPPORTED  # quiet: an answer, not an error
    assert v.temperature is not None and "temperature" not in v.why
    assert [e.where for e in n.errors].count("gpu[0].power_draw") == 2  # still recorded for the sampler
    assert unasked.margin is None and unasked.why["margin"].startswith("not asked")


def test_fault_counters_typed_and_not_supported_said(fake_host) -> None:
    host = fake_host("a100-80g-pcie-1x")
    host.set_state(**{"dev0.remap_failure": 1})
    n = _open()
    try:
        f = n.faults(0, n.handle(0))
    finally:
        n.close()
    assert isinstance(f, FaultCounters)
    assert f.remap_failure is True and f.remap_pending is False and type(f.ecc_uncorrected) is int
    assert f.why == {}
    host = fake_host("rtx4090-1x")
    host.set_state(**{"dev0.ecc_supported": 0})
    n = _open()
    try:
        g = n.faults(0, n.handle(0))
    finally:
        n.close()
    assert all(x is None for x in g.values()) and len(g.values()) == 6
    assert set(g.why) == {
        "ecc_uncorrected",
        "ecc_corrected",
        "retired_pending",
        "remap_uncorrectable",
        "remap_pending",
        "remap_failure",
    }
    assert n.errors == []  # NOT SUPPORTED is an answer (quiet)
