"""``hwprofile verify`` against real vLLM (the CPU build) and the tiny model made offline: greedy
speculative decoding is lossless here, so self-draft and ngram answer exactly as the baseline does,
and a planted numerical difference (float32 instead of bfloat16) is caught. A subset of the prompts
and short answers keep it to a few minutes; the results are validated against the schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from vllmtools import free_port, require_vllm

pytestmark = pytest.mark.slow(minutes=8.5)  # real vLLM: minutes; the fast loop is `pytest -m 'not slow'`

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schemas" / "hwprofile.verify-1.schema.json").read_text())
PER_KIND, MAX_TOKENS = 3, "32"  # 3 prompts of each kind (15 of the 50), 32 tokens each


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


class Env:
    """A short scratch directory (vLLM's IPC socket paths fit 107 bytes), logs on tmpfs, an empty
    config root, hwprofile's environment without outside HWPROFILE_* settings."""

    def __init__(self, model: Path) -> None:
        self.model = model
        self.base = Path(tempfile.mkdtemp(prefix="hwpv-", dir="/tmp"))
        self.logs = Path("/dev/shm") / f"hwprofile-verify-test-{os.getpid()}-{self.base.name}"
        (self.base / "etc").mkdir()
        self.env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("HWPROFILE_", "FAKE_NVML", "LD_LIBRARY_PATH"))
            },
            "HWPROFILE_CONFIG_ROOT": str(self.base / "etc"),
        }
        self.runtimes: list[Path] = []

    def sets(self, port: int, *extra: str) -> list[str]:
        base = [
            "engine.max_model_len=512",
            "cpu.kv_cache_space_gib=0.0625",
            f"server.port={port}",
            f"logs.dir={self.logs}",
            "speculative.num_speculative_tokens=3",
        ]
        return [w for s in [*base, *extra] for w in ("--set", s)]

    def hw(
        self, *args: str, runtime: Path | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, HWPROFILE_RUNTIME_DIR=str(runtime)) if runtime else self.env
        return subprocess.run(
            [sys.executable, "-m", "hwprofile", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def launch(self, name: str, *sets: str) -> str:
        """A server started some other way than verify (here: a detached `hwprofile launch`); its URL."""
        rt = self.base / name
        self.runtimes.append(rt)
        port = free_port()
        r = self.hw("launch", "--model", str(self.model), *self.sets(port, *sets), runtime=rt)
        assert r.returncode == 0, r.stderr[-3000:]
        return f"http://127.0.0.1:{port}"

    def subset(self) -> Path:
        """The first PER_KIND shipped prompts of each kind, as a --prompts file."""
        import yaml

        from hwprofile.verify.prompts import KINDS, load_prompts

        shipped = load_prompts().prompts
        chosen = [p for k in KINDS for p in [q for q in shipped if q.kind == k][:PER_KIND]]
        f = self.base / "subset.yaml"
        f.write_text(
            yaml.safe_dump(
                {"prompts": [{"id": p.id, "kind": p.kind, "text": p.text} for p in chosen]},
                allow_unicode=True,
            )
        )
        return f

    def verify(self, *args: str) -> tuple[int, dict, str]:
        r = self.hw("verify", "--prompts", str(self.subset()), "--max-tokens", MAX_TOKENS, "--json", *args)
        assert r.stdout, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, SCHEMA)
        print(summary(doc))  # the measured figures, in the test log
        return r.returncode, doc, r.stderr

    def close(self) -> None:
        for rt in self.runtimes:
            self.hw("stop", runtime=rt, timeout=120)
        shutil.rmtree(self.logs, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)


def summary(doc: dict) -> str:
    plan = doc["candidate"].get("plan")
    what = "a running server" if plan is None else (plan["speculative"] or {}).get("method", "no speculation")
    return (
        f"verify: candidate {doc['candidate']['url']} ({what}): exact "
        f"{doc['exact_matches']}/{doc['prompts']}, similarity {doc['similarity']['value']:.4f}, passed {doc['passed']}"
    )


@pytest.fixture(scope="module")
def env(tiny: Path) -> Iterator[Env]:
    e = Env(tiny)
    yield e
    e.close()


def test_self_draft_answers_exactly_as_the_baseline(env: Env) -> None:
    """Both plans served here, one after the other: the baseline, then the model as its own draft."""
    port = free_port()
    code, doc, err = env.verify(
        "--model",
        str(env.model),
        "--draft",
        str(env.model),
        *env.sets(port, "speculative.method=draft_model"),
        "--runtime-dir",
        str(env.base / "rt-served"),
    )
    assert code == 0, err[-3000:]
    assert doc["candidate"]["plan"]["speculative"] == {
        "method": "draft_model",
        "model": str(env.model),
        "num_speculative_tokens": 3,
    }
    assert doc["baseline"]["plan"]["speculative"] is None
    assert doc["baseline"]["plan"]["dtype"] == doc["candidate"]["plan"]["dtype"] == "bfloat16"
    assert doc["exact_matches"] == doc["prompts"] == 5 * PER_KIND, summary(doc)
    assert doc["similarity"]["value"] == 1.0 and doc["passed"]
    assert all(r["baseline_tokens"] > 0 for r in doc["results"])


@pytest.fixture(scope="module")
def baseline_url(env: Env) -> str:
    return env.launch("rt-base", "speculative.method=none")


def test_ngram_answers_exactly_as_the_baseline(env: Env, baseline_url: str) -> None:
    """Two running servers (--baseline-url, --url): ngram proposals change nothing greedy."""
    url = env.launch("rt-ngram", "speculative.method=ngram")
    code, doc, err = env.verify("--baseline-url", baseline_url, "--url", url)
    assert code == 0, err[-3000:]
    assert doc["exact_matches"] == doc["prompts"] == 5 * PER_KIND, summary(doc)
    assert doc["similarity"]["value"] == 1.0
    env.hw("stop", runtime=env.base / "rt-ngram", timeout=120)


def test_a_planted_dtype_difference_is_caught(env: Env, baseline_url: str) -> None:
    """The same model in float32 instead of bfloat16: different numbers, different greedy answers."""
    url = env.launch("rt-fp32", "speculative.method=none", "engine.dtype=float32")
    code, doc, err = env.verify("--baseline-url", baseline_url, "--url", url)
    assert code == 1, err[-3000:]
    assert not doc["passed"] and doc["similarity"]["value"] < doc["similarity"]["min"], summary(doc)
    assert doc["exact_matches"] < doc["prompts"]
    diverged = [r for r in doc["results"] if not r["exact"]]
    for r in diverged:
        d = r["first_difference"]
        assert d["baseline"]["token_id"] != d["candidate"]["token_id"]
        assert d["baseline"]["text"] is not None  # decoded through the baseline's /detokenize
        assert d["baseline_logprob"] is not None  # the baseline's own top log-probabilities
    env.hw("stop", runtime=env.base / "rt-fp32", timeout=120)
