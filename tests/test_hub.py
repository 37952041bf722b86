"""Planning a model from the Hugging Face Hub before its download (hwprofile/model/hub.py), against
a stand-in for the Hub on 127.0.0.1: the routes ``huggingface_hub`` calls (``/api/models/{repo}``,
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

import hashlib
import itertools
import json
import os
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from hwprofile.model.hfconfig import parse_config

TOKEN = "hf_standinSECRETtoken0123456789"
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}  # fmt: skip
INDEX_NAME = "model.safetensors.index.json"
ESTIMATE = parse_config(CONFIG, "x", "hub", None).weights_bytes  # ~2.6 GB at 16 bits


def commit(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


def safetensors_header(dtype: str, count: int, tensors: int = 4) -> tuple[bytes, int]:
    """A safetensors file's first bytes (size prefix and JSON header) and its whole size."""
    width = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    per = count // tensors
    meta, offset = {}, 0
    for i in range(tensors):
        meta[f"layers.{i}.weight"] = {"dtype": dtype, "shape": [per], "data_offsets": [offset, offset + per * width]}
        offset += per * width
    raw = json.dumps(meta).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    return head, len(head) + offset


class File:
    """A file of the stand-in: small ones are bytes; a safetensors one is its header, then zeros."""

    def __init__(self, head: bytes, size: int | None = None, lfs: bool = False) -> None:
        self.head, self.size, self.lfs = head, len(head) if size is None else size, lfs
        self.etag = hashlib.sha256(head + str(self.size).encode()).hexdigest()

    def read(self, start: int, end: int) -> bytes:  # [start, end)
        part = self.head[start:end]
        return part + b"\0" * (end - start - len(part))


def json_file(doc: Any) -> File:
    return File(json.dumps(doc).encode())


def shard(dtype: str, count: int) -> File:
    head, size = safetensors_header(dtype, count)
    return File(head, size, lfs=True)


def build_repos() -> dict[str, dict[str, Any]]:
    n = ESTIMATE // 2  # parameters at 16 bits
    third = n // 3
    sharded_names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    shards = {name: shard("BF16", third) for name in sharded_names}
    index = {"metadata": {"total_size": 3 * third * 2}, "weight_map": {f"t{i}": name for i, name in enumerate(sharded_names)}}
    v2 = {**CONFIG, "num_hidden_layers": 32}
    f32 = {k: v for k, v in CONFIG.items() if k != "torch_dtype"}
    small = {"config.json": json_file(CONFIG), "generation_config.json": json_file({"temperature": 0.6}),
             "tokenizer_config.json": json_file({"eos_token": "</s>"}), "README.md": File(b"# small\n"),
             "model.safetensors": shard("BF16", n)}  # fmt: skip
    return {
        "acme/small": {
            "refs": {"main": commit("small-main"), "v2": commit("small-v2")},
            "commits": {
                commit("small-main"): small,
                commit("small-v2"): {"config.json": json_file(v2), "model.safetensors": shard("BF16", 2 * n)},
            },
        },
        "acme/sharded": {
            "refs": {"main": commit("sharded")},
            "commits": {commit("sharded"): {"config.json": json_file(CONFIG),
                                            "model.safetensors.index.json": json_file(index), **shards}},
        },
        "acme/f32": {
            "refs": {"main": commit("f32")},
            "commits": {commit("f32"): {"config.json": json_file(f32), "model.safetensors": shard("F32", n)}},
        },
        "acme/gated": {
            "gated": True,
            "refs": {"main": commit("gated")},
            "commits": {commit("gated"): {"config.json": json_file(CONFIG), "model.safetensors": shard("BF16", n)}},
        },
        "acme/pickle": {
            "refs": {"main": commit("pickle")},
            "commits": {commit("pickle"): {"config.json": json_file(CONFIG),
                                           "pytorch_model.bin": File(b"\x80\x02", 2 * n, lfs=True)}},
        },
        "acme/noconfig": {
            "refs": {"main": commit("noconfig")},
            "commits": {commit("noconfig"): {"model.gguf": File(b"GGUF", 10**9, lfs=True)}},
        },
        "acme/busy": {"busy": True, "refs": {"main": commit("busy")}, "commits": {commit("busy"): {}}},
        "acme/slow": {"slow_api": True, "refs": {"main": commit("slow")}, "commits": {commit("slow"): small}},
        "acme/slowfile": {"slow_file": True, "refs": {"main": commit("slowf")}, "commits": {commit("slowf"): small}},
        # hostile answers (tests/test_hostile_hub.py): each flag names what the stand-in does instead
        **{f"acme/{flag}": {flag: True, "refs": {"main": commit(flag)}, "commits": {commit(flag): hostile_files(flag)}}
           for flag in HOSTILE},
    }


# how a hostile stand-in answers: an endless file list, an endless file (its listed size a lie),
# a file trickled a byte at a time past every deadline, endless safetensors headers, a redirect loop,
# a config nested 20,000 deep, a file list naming a config of 1 GB
HOSTILE = ("endless_api", "endless_file", "endless_index", "trickle_file", "endless_header", "redirect_loop",
           "deep_config", "huge_config")  # fmt: skip


def hostile_files(flag: str) -> dict[str, File]:
    n = ESTIMATE // 2
    f32 = {k: v for k, v in CONFIG.items() if k != "torch_dtype"}
    files = {"config.json": json_file(f32 if flag == "endless_header" else CONFIG), "model.safetensors": shard("BF16", n)}
    if flag == "endless_index":
        files["model.safetensors.index.json"] = json_file({"weight_map": {"t": "model.safetensors"}})
    if flag == "deep_config":
        files["config.json"] = File(b"[" * 20000 + b"]" * 20000)
    if flag == "huge_config":
        files["config.json"] = File(b"{}", 1 << 30)
    return files


class Hub:
    """The stand-in Hub: its repositories, every request it was sent, its base URL."""

    def __init__(self) -> None:
        self.repos = build_repos()
        self.requests: list[dict[str, Any]] = []
        self.sent_bytes: dict[str, int] = {}
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.serve(self, body=True)

            def do_HEAD(self) -> None:
                hub.serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sent(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if kind is None or r["kind"] == kind]

    # -- the routes -------------------------------------------------------------------------------

    def serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlsplit(h.path).path
        auth = h.headers.get("Authorization") or ""
        parts = path.strip("/").split("/")
        kind = "api" if parts[0] == "api" else "resolve" if len(parts) > 3 and parts[2] == "resolve" else "other"
        with self.lock:
            self.requests.append({"kind": kind, "method": h.command, "path": path, "auth": auth,
                                  "range": h.headers.get("Range")})  # fmt: skip
        try:
            if kind == "api" and parts[1] == "models":
                self.api(h, parts[2:], body)
            elif kind == "resolve":
                self.resolve(h, f"{parts[0]}/{parts[1]}", unquote(parts[3]), "/".join(parts[4:]), body, auth)
            else:
                self.reply(h, 404, b"{}", body, {"X-Error-Code": "RepoNotFound"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def reply(self, h: BaseHTTPRequestHandler, code: int, data: bytes, body: bool,
              headers: dict[str, str] | None = None, length: int | None = None) -> None:  # fmt: skip
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def endless(self, h: BaseHTTPRequestHandler, code: int, headers: dict[str, str], first: bytes,
                chunk: bytes = b"a" * 65536, delay: float = 0.0, limit: int = 8 << 30) -> None:  # fmt: skip
        """An answer without end (no Content-Length, the connection closed after it): ``first``, then
        ``chunk`` after ``chunk`` (``delay`` apart) until the client goes or ``limit`` is sent. The
        bytes sent are counted in ``self.sent_bytes[path]``."""
        h.close_connection = True
        h.send_response(code)
        for k, v in headers.items():
            if k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("Connection", "close")
        h.end_headers()
        sent = 0
        try:
            h.wfile.write(first)
            while sent < limit:
                h.wfile.write(chunk)
                h.wfile.flush()
                sent += len(chunk)
                if delay:
                    time.sleep(delay)
        finally:
            with self.lock:
                self.sent_bytes[urlsplit(h.path).path] = sent

    def lookup(self, repo: str, rev: str) -> tuple[dict[str, Any] | None, str | None]:
        r = self.repos.get(repo)
        if r is None:
            return None, None
        sha = rev if rev in r["commits"] else r["refs"].get(rev)
        return r, sha

    def api(self, h: BaseHTTPRequestHandler, rest: list[str], body: bool) -> None:
        repo = "/".join(rest[:2])
        rev = unquote("/".join(rest[3:])) if len(rest) > 3 and rest[2] == "revision" else "main"
        r, sha = self.lookup(repo, rev)
        if r is None:
            return self.reply(h, 404, b'{"error":"Repository not found"}', body, {"X-Error-Code": "RepoNotFound"})
        if r.get("busy"):
            return self.reply(h, 429, b'{"error":"rate limited"}', body, {"Retry-After": "30"})
        if r.get("slow_api"):
            time.sleep(6)
        if r.get("endless_api"):
            return self.endless(
                h, 200, {"Content-Type": "application/json"}, b'{"id": "' + repo.encode() + b'", "x": "'
            )
        if sha is None:
            return self.reply(h, 404, b"{}", body, {"X-Error-Code": "RevisionNotFound"})
        siblings = []
        for name, f in r["commits"][sha].items():
            s: dict[str, Any] = {"rfilename": name, "size": f.size, "blobId": hashlib.sha1(f.head).hexdigest()}
            if f.lfs:
                s["lfs"] = {"size": f.size, "sha256": f.etag, "pointerSize": 134}
            siblings.append(s)
        doc = {"id": repo, "modelId": repo, "sha": sha, "private": False,
               "gated": "manual" if r.get("gated") else False, "siblings": siblings}  # fmt: skip
        self.reply(h, 200, json.dumps(doc).encode(), body, {"Content-Type": "application/json"})

    def resolve(self, h: BaseHTTPRequestHandler, repo: str, rev: str, name: str, body: bool, auth: str) -> None:
        r, sha = self.lookup(repo, rev)
        if r is None:
            return self.reply(h, 404, b"", body, {"X-Error-Code": "RepoNotFound"})
        if sha is None:
            return self.reply(h, 404, b"", body, {"X-Error-Code": "RevisionNotFound"})
        if r.get("gated") and auth != f"Bearer {TOKEN}":
            code = 403 if auth else 401
            return self.reply(h, code, b"", body, {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated",
                                                   "X-Repo-Commit": sha})  # fmt: skip
        if r.get("slow_file"):
            time.sleep(8)
        if r.get("redirect_loop"):
            return self.reply(h, 302, b"", body, {"Location": h.path, "X-Repo-Commit": sha})
        f = r["commits"][sha].get(name)
        if f is None:
            return self.reply(h, 404, b"", body, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{f.etag}"', "Accept-Ranges": "bytes"}
        if f.lfs:
            headers.update({"X-Linked-Size": str(f.size), "X-Linked-Etag": f'"{f.etag}"'})
        rng = h.headers.get("Range")
        endless = "config.json" if r.get("endless_file") else INDEX_NAME if r.get("endless_index") else None
        if body and name == endless:
            return self.endless(h, 200, headers, f.head)
        if body and name == "config.json" and r.get("trickle_file"):
            return self.endless(h, 200, headers, b"{", chunk=b" ", delay=0.2, limit=600)
        if body and rng and r.get("endless_header") and name.endswith(".safetensors"):
            return self.endless(h, 206, {**headers, "Content-Range": f"bytes 0-{f.size - 1}/{f.size}"},
                                struct.pack("<Q", 20_000_000) + b'{"a": "')  # fmt: skip
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) + 1 if b else f.size, f.size)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
            return self.reply(h, 206, f.read(start, end), body, headers)
        if body and f.lfs:  # the weights themselves: hwprofile must never ask for them
            return self.reply(h, 500, b"", body, headers)
        self.reply(h, 200, f.read(0, f.size) if body else b"", body, headers, length=f.size)


@pytest.fixture(scope="module")
def hub():
    h = Hub()
    yield h
    h.close()


@pytest.fixture
def snapshot(host_of, tmp_path: Path) -> Path:
    p = tmp_path / "a100.json"
    p.write_text(host_of("a100-80g-pcie-1x").to_json())
    return p


@pytest.fixture
def env(hub: Hub, tmp_path: Path, empty_root: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_")) and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}  # fmt: skip
    e.update({
        "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HWPROFILE_CONFIG_ROOT": str(empty_root),
        "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost",
    })  # fmt: skip
    return e


def plan(snapshot: Path, env: dict[str, str], *args: str, json_out: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hwprofile", "plan", "--from", str(snapshot), *args]
    return subprocess.run(cmd + (["--json"] if json_out else []), env=env, capture_output=True, text=True, timeout=60)


def model_of(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["model"]


def files_of(hub: Hub, repo: str) -> dict[str, File]:
    r = hub.repos[repo]
    return r["commits"][r["refs"]["main"]]


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
    assert "float32 served as 16-bit" in m["weights_bytes_source"] and "1 safetensors header" in m["weights_bytes_source"]
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
            [sys.executable, "-m", "hwprofile", "render", "--from", str(snapshot), "--model", "acme/small@v2",
             "--format", "argv", "--vllm-version", release], env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        words = r.stdout.replace('"', " ").replace(",", " ").replace("[", " ").replace("]", " ").split()
        pairs = set(itertools.pairwise(words))
        assert {("--revision", commit("small-v2")), ("--tokenizer-revision", commit("small-v2"))} <= pairs, r.stdout


def test_a_gated_model_needs_a_token_that_is_never_shown(hub: Hub, snapshot: Path, env) -> None:
    without = plan(snapshot, env, "--model", "acme/gated")
    assert without.returncode == 1
    assert "accept the license" in without.stderr.lower() and "HF_TOKEN" in without.stderr
    assert "no token was given" in without.stderr
    wrong = plan(snapshot, {**env, "HF_TOKEN": "hf_wrongWRONGwrong"}, "--model", "acme/gated")
    assert wrong.returncode == 1 and "has no access" in wrong.stderr and "hf_wrongWRONGwrong" not in wrong.stderr
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
def test_repositories_that_cannot_be_planned_say_why(hub: Hub, snapshot: Path, env, repo, endpoint, code, says) -> None:
    r = plan(snapshot, {**env, "HF_ENDPOINT": endpoint or env["HF_ENDPOINT"]}, "--model", repo)
    assert r.returncode == code and says in r.stderr, r.stderr
    assert r.stderr.startswith(f"hwprofile: error: model {repo}") and "Traceback" not in r.stderr


@pytest.mark.parametrize("repo", ["acme/slow", "acme/slowfile"])  # the API, then a file, never in time
def test_a_hung_server_is_a_clear_error_quickly(hub: Hub, snapshot: Path, env, repo) -> None:
    t0 = time.monotonic()
    r = plan(snapshot, {**env, "HF_HUB_ETAG_TIMEOUT": "1"}, "--model", repo)
    took = time.monotonic() - t0
    assert r.returncode == 1 and "did not answer in time" in r.stderr and "HF_HUB_ETAG_TIMEOUT" in r.stderr, r.stderr
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
    assert unknown.returncode == 2 and "HF_HUB_OFFLINE is set" in unknown.stderr and "catalog" in unknown.stderr
    assert len(hub.sent()) == before


def test_a_downloaded_model_is_the_cache_not_the_hub(hub: Hub, snapshot: Path, env, tmp_path) -> None:
    """Once the weights are in the snapshot (vLLM downloaded them), the cache is the model."""
    model_of(plan(snapshot, env, "--model", "acme/small"))
    snap = tmp_path / "hf" / "hub" / "models--acme--small" / "snapshots" / commit("small-main")
    (snap / "model.safetensors").write_bytes(files_of(hub, "acme/small")["model.safetensors"].head)
    m = model_of(plan(snapshot, env, "--model", "acme/small"))
    assert m["source"] == "hf-cache" and m["path"] == str(snap)


@pytest.mark.parametrize("repo,label,name,plant", [
    ("acme/small", "small-main", "config.json", "fifo"),
    ("acme/sharded", "sharded", "model.safetensors.index.json", "zero"),
])
def test_a_planted_cache_file_is_an_error_not_a_hang(hub: Hub, snapshot: Path, env, tmp_path, repo, label, name, plant) -> None:
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
