"""tools/real_nvml.py, the readings script for a machine with a real driver, run here against the
fake library: it must write every file and find nothing the fake does not answer itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fakehost import build

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "real_nvml.py"


def test_the_readings_script_runs_against_the_fake(tmp_path, fake_nvml_dir) -> None:
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    host.set_state(**{"dev2.temperature": 87, "dev2.clocks_event_reasons": 0x20})
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--seconds", "2"],
        env=host.env(fake_nvml_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} == {
        "host.json",
        "once.json",
        "samples.json",
        "differences.json",
        "differences.txt",
    }
    d = json.loads((out / "differences.json").read_text())
    assert len(d["gpus"]) == 4 and d["sampler_error"] is None
    assert d["clock_event_bits_not_named"] == [] and d["values_outside_the_fakes_ranges"] == []
    assert d["sample_statuses"] == {"ok": 4 * d["sample_seconds"]["count"]}
    once = json.loads((out / "once.json").read_text())["second"]
    assert {g["index"]: g["state_now"] for g in once}[2] == "hot"  # 87 °C with thermal slowdown on
    host_doc = json.loads((out / "host.json").read_text())
    assert host_doc["schema"] == "hwprofile.host/1"
    # a planted real-driver oddity is found: a bit the decoder does not name, a watt figure in mW
    from importlib import util

    spec = util.spec_from_file_location("real_nvml", SCRIPT)
    assert spec and spec.loader
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    host_doc["gpus"][0]["clocks_event_reasons_mask"] = 0x20 | (1 << 40)
    samples = json.loads((out / "samples.json").read_text())["samples"]
    samples[0][0]["power_draw_watts"] = 60000.0
    odd = mod.differences(host_doc, samples, [0.01], None, 0.1)
    assert odd["clock_event_bits_not_named"] == [hex(1 << 40)]
    assert odd["values_outside_the_fakes_ranges"] == ["gpu[0].power_draw_watts = 60000.0"]
