"""``hwprofile plan --advice-from URL``: the k the server's own acceptance counters argue for,
applied to the plan (and "no speculation" where every k loses to none)."""

from __future__ import annotations

import json
import subprocess
import sys

from fakehost import build
from test_daemon_telemetry import _Server, vllm_text


def _plan(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", "plan", "--json", *args], env=env, capture_output=True, text=True
    )


def test_advice_from_a_server_changes_k(tmp_path, fake_nvml_dir, empty_root) -> None:
    host = build("a800-pcie-4x-2numa", tmp_path / "host")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    srv = _Server()
    try:
        # acceptance collapsing after position 1: k=5 wastes proposals, k=2 is the best
        srv.body = vllm_text(
            drafts=1000, draft_tokens=5000, accepted=1100, per_pos=(800, 250, 40, 8, 2), running=0
        )
        r = _plan(env, "--advice-from", srv.url)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        k = plan["instances"][0]["speculative"]["num_speculative_tokens"]
        assert k in (2, 3) and "advice from" in r.stderr and f"num_speculative_tokens={k}" in r.stderr
        assert plan["instances"][0]["speculative"].get("num_speculative_tokens_per_batch_size") is None
        # a full batch and poor acceptance: no speculation at all
        srv.body = vllm_text(
            drafts=1000, draft_tokens=5000, accepted=300, per_pos=(250, 40, 8, 2, 0), running=192
        )
        r = _plan(env, "--advice-from", srv.url)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["instances"][0]["speculative"] is None
        # a server that does not speculate: said, exit 1
        srv.body = vllm_text(spec=False)
        r = _plan(env, "--advice-from", srv.url)
        assert r.returncode == 1 and "does not speculate" in r.stderr
    finally:
        srv.close()
    r = _plan(env, "--advice-from", srv.url)
    assert r.returncode == 1 and "Connection refused" in r.stderr
