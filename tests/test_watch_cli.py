"""``hwprofile watch`` through the real CLI: the fake NVML (a card heated past the profile's
threshold), a server started outside hwprofile (tests/fakevllm.py here; real vLLM in
test_daemon_vllm.py), JSON lines with each GPU's index and thermal state."""

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
from vllmtools import free_port

FAKE = Path(__file__).resolve().parent / "fakevllm.py"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def fake_server(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKEVLLM_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":3}',
            "--kv-cache-memory-bytes",
            "67108864",
            "--max-model-len",
            "512",
            "--fake-ready-delay",
            "0.1",
        ],
        env={**env, "FAKEVLLM_TOKEN_DELAY": "0.001"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            if opener.open(url + "/health", timeout=1).status == 200:
                break
        except OSError:
            time.sleep(0.05)
    yield url, opener, str(model)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(20)


def _watch(env, *args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", "watch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_watch_once_json_reports_each_gpu_and_the_server(
    tmp_path, fake_nvml_dir, empty_root, fake_server
) -> None:
    url, opener, model = fake_server
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    host.set_state(**{"dev2.temperature": 87, "dev2.clocks_event_reasons": 0x20, "dev2.sm_clock": 1080})
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    body = json.dumps({"model": model, "prompt": "one two three", "max_tokens": 20}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    opener.open(req, timeout=10).read()
    r = _watch(env, "--once", "--json", "--url", url, "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert sorted(gpus) == [0, 1, 2, 3]
    assert all(g["thermal_state"] == "ok" for i, g in gpus.items() if i != 2)
    # a one-shot look says what the card is: 87 °C with thermal slowdown on is hot now (it used to say
    # "ok, hot pending": what the daemon's dwell timer had not confirmed yet)
    assert gpus[2]["thermal_state"] == "hot" and gpus[2]["pending"] is None, gpus[2]
    assert "87 °C >= hot" in gpus[2]["reason"]
    assert gpus[2]["temperature_c"] == 87 and "sw_thermal_slowdown" in gpus[2]["clocks_event_reasons"]
    (inst,) = doc["instances"]
    assert inst["status"] == "ok" and inst["running"] == 0
    assert doc["actions"] == []  # watch never acts


def test_watch_streams_json_lines_and_the_profile_threshold_decides(
    tmp_path, fake_nvml_dir, empty_root, fake_server
) -> None:
    url, _opener, _model = fake_server
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    host.set_state(**{"dev1.temperature": 82})  # the A800 profile's hot_c (seed 000)
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", "watch", "--json", "--url", url, "--interval", "0.5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    docs = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            docs.append(json.loads(line))
            if len(docs) >= 10:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    states = [{g["index"]: g["thermal_state"] for g in d["gpus"]}[1] for d in docs]
    assert states[0] == "ok" and states[-1] == "hot"  # held for watch.dwell_s (3 s) at 82 °C
    # the default profile's threshold (83 °C) would not call 82 °C hot
    r = _watch(env, "--json", "--once", "--profile", "generic-large", "--set", "watch.dwell_s=0")
    (doc,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert {g["index"]: g for g in doc["gpus"]}[1]["thermal_state"] == "warm", doc


def test_watch_settings_are_validated_like_every_setting(tmp_path, fake_nvml_dir, empty_root) -> None:
    host = build("rtx4090-1x", tmp_path / "host")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    r = _watch(env, "--once", "--set", "watch.hot_c=hot")
    assert r.returncode == 2 and "watch.hot_c" in r.stderr and "Traceback" not in r.stderr
    r = _watch(env, "--once", "--set", "watch.hot_c=500")
    assert r.returncode == 2 and "watch.hot_c" in r.stderr
    r = _watch(env, "--once", "--interval", "0")
    assert r.returncode == 2 and "--interval" in r.stderr
    r = _watch(env, "--once", "--json", "--url", "http://127.0.0.1:9")
    assert r.returncode == 1 and "is unreachable" in r.stderr  # the report still comes, then the failure
    doc = json.loads(r.stdout.splitlines()[0])
    assert doc["instances"][0]["status"] == "unreachable"


def test_watch_leaves_on_sigterm_while_it_waits(tmp_path, fake_nvml_dir, empty_root) -> None:
    host = build("rtx4090-1x", tmp_path / "host")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "watch",
            "--json",
            "--url",
            "http://127.0.0.1:1",
            "--interval",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert (
            proc.stdout is not None and json.loads(proc.stdout.readline())["gpus"]
        )  # the first tick, then a wait
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(45) == 0  # within the 60 s wait, not after it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_reads_the_latency_histograms_the_server_exports(
    tmp_path, fake_nvml_dir, empty_root, fake_server
) -> None:
    """TTFT and inter-token latency from vLLM's histograms over the window (the fake exports them with
    vLLM's bucket edges and measures each request's first token and the gaps after it)."""
    url, opener, model = fake_server
    host = build("rtx4090-1x", tmp_path / "host")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwprofile", "watch", "--json", "--url", url, "--interval", "0.3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    body = json.dumps({"model": model, "prompt": "one two three", "max_tokens": 12}).encode()
    seen = None
    try:
        assert proc.stdout is not None
        for n, line in enumerate(proc.stdout):
            (inst,) = json.loads(line)["instances"]
            if inst.get("ttft_p99_s") is not None:
                seen = inst
                break
            assert n < 40, inst
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            opener.open(req, timeout=10).read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert seen is not None
    # the fake answers at once with ~1 ms a token: under vLLM's smallest buckets
    assert 0 < seen["ttft_p99_s"] <= 0.02 and 0 < seen["itl_p99_s"] <= 0.05, seen
