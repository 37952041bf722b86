"""hwprofile bench against real vLLM (the CPU build) serving the tiny model with itself as the draft:
real `vllm bench serve` on a short sweep (concurrency 1 and 2), its result read back, the
speculative acceptance from the server's /metrics, the JSON against schemas/hwprofile.bench-1,
the PNG with the axes and lines the JSON names, and the argv against the installed tool's --help."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
from vllmtools import VLLM, free_port

from hwprofile.plan.predict import acceptance_of_length

pytestmark = pytest.mark.slow(minutes=4)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "schemas" / "hwprofile.bench-1.schema.json").read_text()
)


def test_sweep_with_self_draft_against_real_vllm(tiny: Path, tmp_path: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="hwpbv-", dir="/tmp"))  # vLLM's IPC socket paths fit 107 bytes
    logs = Path("/dev/shm") / f"hwprofile-test-bench-{os.getpid()}"
    (tmp_path / "etc").mkdir()
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HWPROFILE_", "FAKE_NVML", "LD_LIBRARY_PATH"))
        },
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
    }
    sets = [
        "engine.max_model_len=512",
        "cpu.kv_cache_space_gib=0.0625",
        "speculative.method=draft_model",
        "speculative.num_speculative_tokens=3",
        f"server.port={free_port()}",
        f"logs.dir={logs}",
        "bench.input_len=32",
        "bench.output_len=16",
        "bench.num_prompts=4",
        "bench.sweep_max=2",
        "bench.ttft_p99_target_ms=100000",
    ]
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "hwprofile",
        "bench",
        "--model",
        str(tiny),
        "--draft",
        str(tiny),
        "--workload",
        "sweep",
        "--output",
        str(out),
        "--runtime-dir",
        str(runtime),
        "--calibrate",
    ]
    for s in sets:
        cmd += ["--set", s]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    doc = json.loads((out / "bench.json").read_text())
    errors = [f"{e.json_path}: {e.message}" for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)]
    assert not errors, errors[:5]
    # a CPU host: the first line says there is nothing to sample, and every point carries that tag
    assert (
        r.stdout.splitlines()[0]
        == doc["headline"]
        == "CPU host: no GPU clock/throttle tags (no NVIDIA GPU here, nothing to sample)"
    )
    assert not doc["throttled"] and doc["host"]["cpu"]["error"] is None and doc["host"]["cpu"]["brand"]
    assert doc["host"]["vllm_version"].startswith("0.32")
    (plan,) = doc["plans"]
    assert plan["speculative"]["method"] == "draft_model" and plan["speculative"]["model"] == str(tiny)
    assert doc["workload"]["dataset"] == "prompts"  # a speculating plan: vLLM's reader sent the real prompts
    assert {
        "key": "speculative.method",
        "value": "draft_model",
        "default": "auto",
        "source": "cli --set speculative.method=draft_model",
    } in plan["non_default_settings"]
    (run,) = plan["runs"]
    assert [p["concurrency"] for p in run["points"]] == [1, 2]
    for p in run["points"]:
        assert p["completed"] == 4 and p["failed"] == 0 and p["output_throughput"] > 0
        assert p["hardware"]["status"] == "no_gpu"
        lat = p["latency_ms"]
        assert (
            0 < lat["ttft"]["p50"] <= lat["ttft"]["p99"] and lat["tpot"]["p99"] > 0 and lat["itl"]["p99"] > 0
        )
        # vLLM's own result file is what was read
        raw = json.loads(Path(p["vllm_bench"]["result_file"]).read_text())
        assert raw["p99_ttft_ms"] == lat["ttft"]["p99"] and raw["max_concurrency"] == p["concurrency"]
        # acceptance from /metrics around the whole `vllm bench serve` (its initial test request too),
        # so at least what vllm bench serve counted over its measured window
        spec, theirs = p["spec_decode"], p["vllm_bench"]["spec_decode_reported"]
        assert spec is not None and theirs is not None, p
        assert (
            spec["draft_tokens"] >= theirs["draft_tokens"] > 0 and spec["num_drafts"] >= theirs["num_drafts"]
        )
        assert 0 <= spec["acceptance_rate"] <= 1 and 1 <= spec["mean_acceptance_length"] <= 4
        assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["draft_tokens"])
        assert len(spec["per_position_acceptance"]) == 3
    knee = plan["knee"]
    assert knee["recommended_max_num_seqs"] == 2 and knee["breaks_at"] is None  # a target nothing breaks
    # the plot: a PNG of the size the JSON says, the plan's line on both axes and the target
    import matplotlib.image

    img = matplotlib.image.imread(out / doc["plot"]["file"])
    assert img.shape[:2] == (doc["plot"]["height_px"], doc["plot"]["width_px"])
    thr, ttft = doc["plot"]["axes"]
    assert thr["lines"] == ["profile"] and thr["ylabel"] == "output tokens/s"
    assert (
        sorted(ttft["lines"]) == ["profile", "target 100000 ms"] and ttft["xlabel"] == "concurrent requests"
    )
    # --calibrate kept it as this host's calibration: the acceptance vLLM's counters measured (the median
    # over the concurrencies of what each one's mean acceptance length gives at k = 3) is the plan's for
    # the same method
    lengths = [row["mean_acceptance_length"]["median"] for row in plan["summary"]]
    again = subprocess.run(
        [sys.executable, "-m", "hwprofile", "plan", "--json", "--model", str(tiny), "--draft", str(tiny)]
        + [x for s in sets[:4] for x in ("--set", s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    said = [r for r in json.loads(again.stdout)["reasons"] if r["key"] == "speculative.assumed_acceptance"]
    assert said and said[-1]["reason"].startswith(
        f"measured, for an instance that speculates by draft_model and {tiny}: "
    )
    each = [acceptance_of_length(length, 3) for length in lengths]  # each concurrency's, at the k it ran
    assert said[-1]["value"] == round(statistics.median(each), 6), (said, lengths)
    # every flag hwprofile gave vllm bench serve is one the installed tool lists
    helptext = subprocess.run(
        [str(VLLM), "bench", "serve", "--help=all"], capture_output=True, text=True, timeout=300
    ).stdout
    known = set(re.findall(r"(--[a-z][a-z0-9-]+)", helptext))
    given = {a for a in run["points"][0]["vllm_bench"]["argv"] if a.startswith("--")}
    assert given and given <= known, given - known
