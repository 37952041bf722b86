"""The daemon and ``watch`` against real vLLM (the CPU build, a tiny model made offline), with the
fake libnvidia-ml.so.1 standing in for the GPU: a card heated past the profile's threshold makes
the daemon restart vLLM with the degraded settings (checked in vLLM's own startup log), cooled it
recovers; ``watch --once --json`` reads a vLLM started outside hwprofile. Minutes, not seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fakehost import build
from vllmtools import free_port, serve, stop, wait_for_log

pytestmark = pytest.mark.slow(minutes=7)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`


READY = 480


def _non_default_args(log: Path) -> list[dict]:
    import ast

    from hwprofile.supervise.verify import _NON_DEFAULT

    return [ast.literal_eval(m.group(1)) for m in _NON_DEFAULT.finditer(log.read_text(errors="replace"))]


def _daemon(host_env: dict, root: Path, tiny: Path, tmp_path: Path, tag: str):
    """``hwprofile daemon`` on the fake host with the config root ``root``: the process, its
    environment, its runtime dir, a reader of daemon.json and a wait that fails if the daemon exits."""
    runtime = Path(f"/tmp/{tag}-{os.getpid()}")
    env = {**host_env, "HWPROFILE_CONFIG_ROOT": str(root), "HWPROFILE_RUNTIME_DIR": str(runtime)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "daemon",
            "--model",
            str(tiny),
            "--set",
            f"server.port={free_port()}",
            "--set",
            f"logs.dir={tmp_path / 'logs'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def doc() -> dict:
        try:
            return json.loads((runtime / "daemon.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait(pred, what, timeout=READY):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise AssertionError(f"the daemon exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
            got = pred()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(
            f"timed out: {what}; stderr: {proc.stderr.read()[-3000:] if proc.stderr else ''}"
        )

    return proc, env, runtime, doc, wait


def test_watch_once_json_against_a_vllm_started_elsewhere(tiny, tmp_path, fake_nvml_dir, empty_root) -> None:
    port = free_port()
    proc, log = serve(
        tiny,
        port,
        [
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            "64M",
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}',
        ],
        tmp_path / "vllm",
    )
    try:
        wait_for_log(proc, log, r"Application startup complete", READY)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        body = json.dumps(
            {
                "model": str(tiny),
                "prompt": "one two three one two three one two",
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        opener.open(req, timeout=120).read()
        host = build("rtx4090-1x", tmp_path / "host")
        env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "watch",
                "--once",
                "--json",
                "--url",
                f"http://127.0.0.1:{port}",
                "--interval",
                "1",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        (doc,) = [json.loads(x) for x in r.stdout.splitlines()]
        assert doc["gpus"][0]["index"] == 0 and doc["gpus"][0]["thermal_state"] == "ok"
        (inst,) = doc["instances"]
        assert inst["status"] == "ok" and inst["kv_usage"] is not None and inst["running"] == 0
        # vLLM's own counters over the second between the two samples: no traffic, no drafts yet
        assert inst["acceptance_rate"] is None
    finally:
        stop(proc)


def test_daemon_degrades_real_vllm_when_the_card_heats_and_recovers(tiny, tmp_path, fake_nvml_dir) -> None:
    host = build("rtx4090-1x", tmp_path / "host")
    root = tmp_path / "etc"
    (root / "overrides.d").mkdir(parents=True)
    (root / "overrides.d" / "test.yaml").write_text(
        "engine: {max_num_seqs: 8, max_num_batched_tokens: 1024, max_model_len: 512, kv_cache_dtype: auto,\n"
        "         enforce_eager: true}\n"
        "speculative: {method: none}\n"
        "layout: {numa_bind: false}\n"
        "server: {shutdown_timeout: 5, extra_args: ['--kv-cache-memory-bytes', '64M']}\n"
        "watch: {hot_c: 80, interval: 0.5, dwell_s: 1, recover_s: 3, metrics_port: 0}\n"
    )
    proc, env, runtime, doc, wait = _daemon(host.env(fake_nvml_dir), root, tiny, tmp_path, "hwpv")

    try:
        wait(lambda: (i := doc().get("instances")) and i[0]["status"] == "ok", "vLLM ready and scraped")
        st = subprocess.run(
            [sys.executable, "-m", "hwprofile", "status", "--json"], env=env, capture_output=True, text=True
        )
        log = Path(json.loads(st.stdout)["instances"][0]["log_file"])
        assert _non_default_args(log)[-1]["max_num_seqs"] == 8
        host.set_state(**{"dev0.temperature": 84})  # above the override's hot_c 80
        wait(
            lambda: (
                len(_non_default_args(log)) >= 2
                and any(a["outcome"] == "done" for a in doc().get("actions") or [])
            ),
            "the degraded restart",
        )
        degraded = _non_default_args(log)[-1]
        assert degraded["max_num_seqs"] == 6 and degraded["max_num_batched_tokens"] == 768  # x0.75
        host.set_state(**{"dev0.temperature": 60})
        wait(
            lambda: (
                len(_non_default_args(log)) >= 3 and doc().get("degrade_levels", {}).get("vllm-gpu0") == 0
            ),
            "the recovery",
        )
        assert _non_default_args(log)[-1]["max_num_seqs"] == 8
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0
    assert not (runtime / "state.json").exists()


def test_live_overrides_against_real_vllm(tiny, tmp_path, fake_nvml_dir) -> None:
    """Edit an override while the daemon runs: a new gpu_memory_utilization restarts the instance
    (vLLM's own startup log shows the value); a comment-only edit, broken YAML and a watch.* change
    restart nothing (the broken file is reported with its line, the threshold is live at once)."""
    host = build("rtx4090-1x", tmp_path / "host")
    root = tmp_path / "etc"
    (root / "overrides.d").mkdir(parents=True)
    base = (
        "engine: {max_num_seqs: 8, max_num_batched_tokens: 1024, max_model_len: 512, kv_cache_dtype: auto,\n"
        "         enforce_eager: true, gpu_memory_utilization: 0.5}\n"
        "speculative: {method: none}\n"
        "layout: {numa_bind: false}\n"
        "server: {shutdown_timeout: 5, extra_args: ['--kv-cache-memory-bytes', '64M']}\n"
        "watch: {interval: 0.5, metrics_port: 0}\n"
    )
    site = root / "overrides.d" / "10-site.yaml"
    site.write_text(base)
    proc, env, _runtime, doc, wait = _daemon(host.env(fake_nvml_dir), root, tiny, tmp_path, "hwpo")

    try:
        wait(lambda: (i := doc().get("instances")) and i[0]["status"] == "ok", "vLLM ready and scraped")
        st = subprocess.run(
            [sys.executable, "-m", "hwprofile", "status", "--json"], env=env, capture_output=True, text=True
        )
        log = Path(json.loads(st.stdout)["instances"][0]["log_file"])
        assert [a["gpu_memory_utilization"] for a in _non_default_args(log)] == [0.5]
        site.write_text(base.replace("0.5}", "0.6}"))
        wait(
            lambda: (
                len(_non_default_args(log)) >= 2 and doc().get("instances", [{}])[0].get("status") == "ok"
            ),
            "the restart with the new share",
        )
        assert _non_default_args(log)[-1]["gpu_memory_utilization"] == 0.6
        starts = len(_non_default_args(log))
        # a comment only: nothing restarts
        site.write_text("# tuned on 2026-12-01\n" + base.replace("0.5}", "0.6}"))
        time.sleep(5)
        # broken YAML: nothing restarts, the file and line are reported
        site.write_text(base.replace("0.5}", "0.6}") + "engine: [\n")
        wait(
            lambda: "10-site.yaml" in json.dumps(doc().get("reload") or doc().get("errors") or ""),
            "the error",
        )
        # a threshold only the daemon uses: live at once, nothing restarts
        site.write_text(
            base.replace("0.5}", "0.6}").replace("metrics_port: 0}", "metrics_port: 0, hot_c: 77}")
        )
        wait(lambda: doc().get("watch", {}).get("hot_c") == 77, "the new threshold")
        assert len(_non_default_args(log)) == starts
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0
