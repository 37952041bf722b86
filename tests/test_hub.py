"""Planning a model from the Hugging Face Hub before its download (hwprofile/model/hub.py), against
a stand-in for the Hub on 127.0.0.1 (tests/hubstub.py): the routes ``huggingface_hub`` calls (``/api/models/{repo}``,
``/api/models/{repo}/revision/{rev}``, ``/{repo}/resolve/{rev}/{file}`` with HEAD, GET and Range,
and the headers it requires: X-Repo-Commit, ETag, Content-Length, X-Linked-Size and X-Linked-Etag
for LFS files, X-Error-Code on errors), ``HF_ENDPOINT`` pointing at it and ``HF_HOME`` in tmp_path.

A public model, a sharded one (index and three shards: the plan's weights are the shards' sizes), a
float32 one without a dtype (its safetensors header read by a range request), a revision (flag and
``name@rev``), a gated one with and without a token (which no output ever shows), a repository with
only pickle weights, one without config.json, a rate limit, a hung server (a clear error, quickly),
offline mode after a first look-up (from the cache, no request) and without one (the catalog, or a
message). No weights are ever downloaded: the stand-in's shards are headers followed by zeros it
never sends whole. Fast and offline.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hubstub import CONFIG, TOKEN, Hub, commit, files_of, hub_env, model_of, plan, serve, write_snapshot


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    yield from serve()


@pytest.fixture
def snapshot(host_of, tmp_path: Path) -> Path:
    return write_snapshot(host_of("a100-80g-pcie-1x"), tmp_path)


@pytest.fixture
def env(hub: Hub, tmp_path: Path, empty_root: Path) -> dict[str, str]:
    return hub_env(hub, tmp_path / "hf", empty_root, etag_timeout="2")


def test_a_public_model_plans_from_its_config_and_file_sizes(hub: Hub, snapshot: Path, env, tmp_path) -> None:
    before = len(hub.sent())
    m = model_of(plan(snapshot, env, "--model", "acme/small"))
    files = files_of(hub, "acme/small")
    assert (m["name"], m["source"], m["path"]) == ("acme/small", "hub", None)
    assert m["weights_bytes"] == files["model.safetensors"].size
    assert m["weights_bytes_source"] == "hub safetensors files"
    assert m["revision"] == commit("small-main") and "revision main" in m["origin"]
    assert m["layers"] == 16
    mine = hub.sent()[before:]
    fetched = {r["path"].rsplit("/", 1)[-1] for r in mine if r["kind"] == "resolve" and r["method"] == "GET"}
    assert fetched == {"config.json", "generation_config.json", "tokenizer_config.json"}  # never the weights
    # the Hugging Face cache layout, where vLLM and the next plan find them; the file list beside them
    repo = tmp_path / "hf" / "hub" / "models--acme--small"
    assert (repo / "refs" / "main").read_text() == commit("small-main")
    assert json.loads((repo / "snapshots" / commit("small-main") / "config.json").read_text()) == CONFIG
    record = json.loads((repo / "hwprofile" / f"{commit('small-main')}.json").read_text())
    assert record["weights"]["files"] == ["model.safetensors"] and "README.md" in record["files"]
    # --explain says where the model came from
    text = plan(snapshot, env, "--model", "acme/small", "--explain", json_out=False)
    assert text.returncode == 0, text.stderr
    assert "from the Hub (" in text.stdout and str(repo / "hwprofile") in text.stdout
    # the second plan asks the Hub for the commit only: the files come from the cache
    before = len(hub.sent())
    again = model_of(plan(snapshot, env, "--model", "acme/small"))
    assert again["weights_bytes"] == m["weights_bytes"]
    assert [r["kind"] for r in hub.sent()[before:]] == ["api"]


def test_a_sharded_model_weighs_its_shards(hub: Hub, snapshot: Path, env) -> None:
    before = len(hub.sent())
    m = model_of(plan(snapshot, env, "--model", "acme/sharded"))
    files = files_of(hub, "acme/sharded")
    shards = [f for name, f in files.items() if name.endswith(".safetensors")]
    assert len(shards) == 3
    assert m["weights_bytes"] == sum(f.size for f in shards)
    assert m["weights_bytes_source"] == "hub safetensors index"
    assert not [r for r in hub.sent()[before:] if r["path"].endswith(".safetensors")]  # sizes from the list


def test_float32_without_a_dtype_reads_a_safetensors_header(hub: Hub, snapshot: Path, env) -> None:
    before = len(hub.sent())
    m = model_of(plan(snapshot, env, "--model", "acme/f32"))
    size = files_of(hub, "acme/f32")["model.safetensors"].size
    assert (
        "float32 served as 16-bit" in m["weights_bytes_source"]
        and "1 safetensors header" in m["weights_bytes_source"]
    )
    assert abs(m["weights_bytes"] - size // 2) < 4096  # F32 on disk, 16-bit in memory
    reads = [r for r in hub.sent()[before:] if r["path"].endswith("model.safetensors")]
    assert reads and all(r["method"] == "GET" and r["range"] == "bytes=0-100000" for r in reads)
    before = len(hub.sent())
    assert model_of(plan(snapshot, env, "--model", "acme/f32")) == m  # the header's answer was kept
    assert [r["kind"] for r in hub.sent()[before:]] == ["api"]


def test_a_revision_by_flag_or_after_an_at(hub: Hub, snapshot: Path, env) -> None:
    by_flag = model_of(plan(snapshot, env, "--model", "acme/small", "--revision", "v2"))
    by_at = model_of(plan(snapshot, env, "--model", "acme/small@v2"))
    assert by_flag == by_at
    assert by_flag["revision"] == commit("small-v2") and by_flag["layers"] == 32
    assert by_flag["name"] == "acme/small"  # what vLLM is given; the commit travels beside it
    by_commit = model_of(plan(snapshot, env, "--model", f"acme/small@{commit('small-v2')}"))
    assert by_commit["layers"] == 32
    missing = plan(snapshot, env, "--model", "acme/small", "--revision", "nope")
    assert missing.returncode == 2 and "no revision nope" in missing.stderr
    clash = plan(snapshot, env, "--model", "acme/small@v2", "--revision", "main")
    assert clash.returncode == 2 and "two revisions" in clash.stderr
    # vLLM is given the commit that was planned, for the weights and the tokenizer: not main's
    for release in ("0.6.3", "0.33.0"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwprofile",
                "render",
                "--from",
                str(snapshot),
                "--model",
                "acme/small@v2",
                "--format",
                "argv",
                "--vllm-version",
                release,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        words = r.stdout.replace('"', " ").replace(",", " ").replace("[", " ").replace("]", " ").split()
        pairs = set(itertools.pairwise(words))
        assert {("--revision", commit("small-v2")), ("--tokenizer-revision", commit("small-v2"))} <= pairs, (
            r.stdout
        )


def test_a_gated_model_needs_a_token_that_is_never_shown(hub: Hub, snapshot: Path, env) -> None:
    without = plan(snapshot, env, "--model", "acme/gated")
    assert without.returncode == 1
    assert "accept the license" in without.stderr.lower() and "HF_TOKEN" in without.stderr
    assert "no token was given" in without.stderr
    wrong = plan(snapshot, {**env, "HF_TOKEN": "hf_wrongWRONGwrong"}, "--model", "acme/gated")
    assert (
        wrong.returncode == 1 and "has no access" in wrong.stderr and "hf_wrongWRONGwrong" not in wrong.stderr
    )
    ok = plan(snapshot, {**env, "HF_TOKEN": TOKEN}, "--model", "acme/gated", "--explain", json_out=False)
    assert ok.returncode == 0, ok.stderr
    assert any(r["auth"] == f"Bearer {TOKEN}" for r in hub.sent("resolve"))  # huggingface_hub sent it
    for r in (without, wrong, ok):
        assert TOKEN not in r.stdout + r.stderr


@pytest.mark.parametrize(
    ("repo", "endpoint", "code", "says"),
    [
        ("acme/pickle", None, 1, "only pickle weights (pytorch_model.bin)"),
        ("acme/noconfig", None, 2, "has no config.json"),
        ("acme/nothing-here", None, 2, "no such model on the Hub"),
        ("acme/busy", None, 1, "(HTTP 429, retry after 30 s)"),
        ("acme/small", "http://127.0.0.1:9", 1, "cannot reach the Hub at http://127.0.0.1:9"),
    ],
)
def test_repositories_that_cannot_be_planned_say_why(
    hub: Hub, snapshot: Path, env, repo, endpoint, code, says
) -> None:
    r = plan(snapshot, {**env, "HF_ENDPOINT": endpoint or env["HF_ENDPOINT"]}, "--model", repo)
    assert r.returncode == code and says in r.stderr, r.stderr
    assert r.stderr.startswith(f"hwprofile: error: model {repo}") and "Traceback" not in r.stderr


@pytest.mark.parametrize("repo", ["acme/slow", "acme/slowfile"])  # the API, then a file, never in time
def test_a_hung_server_is_a_clear_error_quickly(hub: Hub, snapshot: Path, env, repo) -> None:
    t0 = time.monotonic()
    r = plan(snapshot, {**env, "HF_HUB_ETAG_TIMEOUT": "1"}, "--model", repo)
    took = time.monotonic() - t0
    assert r.returncode == 1 and "did not answer in time" in r.stderr and "HF_HUB_ETAG_TIMEOUT" in r.stderr, (
        r.stderr
    )
    # 4 x 1 s at most, plus the interpreter: a bound that a loaded machine keeps (a hung server that
    # was waited on without the timeout would hold it until the test's own timeout)
    assert took < 4 + 40, took


def test_offline_plans_from_the_cache_or_the_catalog(hub: Hub, snapshot: Path, env, tmp_path) -> None:
    online = model_of(plan(snapshot, env, "--model", "acme/sharded"))
    before = len(hub.sent())
    off = {**env, "HF_HUB_OFFLINE": "1"}
    cached = model_of(plan(snapshot, off, "--model", "acme/sharded"))
    assert len(hub.sent()) == before  # not one request
    assert cached["weights_bytes"] == online["weights_bytes"] and cached["source"] == "hub"
    assert "HF_HUB_OFFLINE" in cached["origin"]
    # no network at all: the endpoint is dead, the cache still plans
    dead = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = plan(snapshot, dead, "--model", "acme/sharded")
    assert model_of(r)["weights_bytes"] == online["weights_bytes"]
    # a fresh cache offline: a catalog name plans, another name says what to do
    fresh = {**off, "HF_HOME": str(tmp_path / "fresh")}
    assert model_of(plan(snapshot, fresh, "--model", "Qwen/Qwen3-8B"))["source"] == "catalog"
    unknown = plan(snapshot, fresh, "--model", "acme/small")
    assert (
        unknown.returncode == 2 and "HF_HUB_OFFLINE is set" in unknown.stderr and "catalog" in unknown.stderr
    )
    assert len(hub.sent()) == before


def test_a_downloaded_model_is_the_cache_not_the_hub(hub: Hub, snapshot: Path, env, tmp_path) -> None:
    """Once the weights are in the snapshot (vLLM downloaded them), the cache is the model."""
    model_of(plan(snapshot, env, "--model", "acme/small"))
    snap = tmp_path / "hf" / "hub" / "models--acme--small" / "snapshots" / commit("small-main")
    (snap / "model.safetensors").write_bytes(files_of(hub, "acme/small")["model.safetensors"].head)
    m = model_of(plan(snapshot, env, "--model", "acme/small"))
    assert m["source"] == "hf-cache" and m["path"] == str(snap)


@pytest.mark.parametrize(
    "repo,label,name,plant",
    [
        ("acme/small", "small-main", "config.json", "fifo"),
        ("acme/sharded", "sharded", "model.safetensors.index.json", "zero"),
    ],
)
def test_a_planted_cache_file_is_an_error_not_a_hang(
    hub: Hub, snapshot: Path, env, tmp_path, repo, label, name, plant
) -> None:
    """The cache is a place others write: a FIFO or a link to /dev/zero where a JSON file belongs is a
    clear error (exit 2), read by the bounded reader, not a plan that blocks or fills memory."""
    model_of(plan(snapshot, env, "--model", repo))
    owner, short = repo.split("/")
    f = tmp_path / "hf" / "hub" / f"models--{owner}--{short}" / "snapshots" / commit(label) / name
    assert f.exists()
    f.unlink()
    if plant == "fifo":
        os.mkfifo(f)
    else:
        f.symlink_to("/dev/zero")

    def refused(e: dict[str, str]) -> None:
        r = plan(snapshot, e, "--model", repo)
        assert r.returncode == 2 and name in r.stderr and "cannot read" in r.stderr, r.stderr

    if name == "config.json":  # with the file list hwprofile kept: the config is still read, online or not
        refused(env)
        refused({**env, "HF_HUB_OFFLINE": "1"})
    for rec in (f.parents[2] / "hwprofile").glob("*.json"):
        rec.unlink()
    refused(env)  # without it: every file is read again


def test_without_huggingface_hub_the_fix_is_named(monkeypatch, tmp_path) -> None:
    from hwprofile.errors import RefusedError
    from hwprofile.model import resolve_model

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(RefusedError, match="pip install huggingface_hub"):
        resolve_model("acme/not-cached")


def test_names_and_revisions_are_checked() -> None:
    from hwprofile.config import ConfigError
    from hwprofile.model.hub import is_repo_id, split_revision, with_revision

    assert is_repo_id("meta-llama/Llama-3.3-70B-Instruct") and not is_repo_id("a/../b")
    assert not is_repo_id("./local") and not is_repo_id("one")
    assert split_revision("org/m@refs/pr/1") == ("org/m", "refs/pr/1")
    assert with_revision("org/m", "v1") == "org/m@v1"
    for bad in ("org/m@", "org/m@../x", "org/m@a b"):
        with pytest.raises(ConfigError):
            split_revision(bad)
    with pytest.raises(ConfigError, match="needs --model"):
        with_revision(None, "v1")
