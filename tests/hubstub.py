"""A stand-in for the Hugging Face Hub on 127.0.0.1 (tests/test_hub.py, tests/test_hostile_hub.py):
the routes ``huggingface_hub`` calls (``/api/models/{repo}``, ``/api/models/{repo}/revision/{rev}``,
``/{repo}/resolve/{rev}/{file}`` with HEAD, GET and Range) and the headers it requires, its
repositories (public, sharded, float32, revisions, gated, broken, hostile), and the ``hwprofile
plan`` run against it with ``HF_ENDPOINT`` pointing there and ``HF_HOME`` in the test's folder.
The stand-in's shards are headers followed by zeros it never sends whole."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from hwprofile.model.hfconfig import parse_config

TOKEN = "hf_standinSECRETtoken0123456789"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
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
        meta[f"layers.{i}.weight"] = {
            "dtype": dtype,
            "shape": [per],
            "data_offsets": [offset, offset + per * width],
        }
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
    index = {
        "metadata": {"total_size": 3 * third * 2},
        "weight_map": {f"t{i}": name for i, name in enumerate(sharded_names)},
    }
    v2 = {**CONFIG, "num_hidden_layers": 32}
    f32 = {k: v for k, v in CONFIG.items() if k != "torch_dtype"}
    small = {
        "config.json": json_file(CONFIG),
        "generation_config.json": json_file({"temperature": 0.6}),
        "tokenizer_config.json": json_file({"eos_token": "</s>"}),
        "README.md": File(b"# small\n"),
        "model.safetensors": shard("BF16", n),
    }
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
            "commits": {
                commit("sharded"): {
                    "config.json": json_file(CONFIG),
                    "model.safetensors.index.json": json_file(index),
                    **shards,
                }
            },
        },
        "acme/f32": {
            "refs": {"main": commit("f32")},
            "commits": {commit("f32"): {"config.json": json_file(f32), "model.safetensors": shard("F32", n)}},
        },
        "acme/gated": {
            "gated": True,
            "refs": {"main": commit("gated")},
            "commits": {
                commit("gated"): {"config.json": json_file(CONFIG), "model.safetensors": shard("BF16", n)}
            },
        },
        "acme/pickle": {
            "refs": {"main": commit("pickle")},
            "commits": {
                commit("pickle"): {
                    "config.json": json_file(CONFIG),
                    "pytorch_model.bin": File(b"\x80\x02", 2 * n, lfs=True),
                }
            },
        },
        "acme/noconfig": {
            "refs": {"main": commit("noconfig")},
            "commits": {commit("noconfig"): {"model.gguf": File(b"GGUF", 10**9, lfs=True)}},
        },
        "acme/busy": {"busy": True, "refs": {"main": commit("busy")}, "commits": {commit("busy"): {}}},
        "acme/slow": {"slow_api": True, "refs": {"main": commit("slow")}, "commits": {commit("slow"): small}},
        "acme/slowfile": {
            "slow_file": True,
            "refs": {"main": commit("slowf")},
            "commits": {commit("slowf"): small},
        },
        # hostile answers (tests/test_hostile_hub.py): each flag names what the stand-in does instead
        **{
            f"acme/{flag}": {
                flag: True,
                "refs": {"main": commit(flag)},
                "commits": {commit(flag): hostile_files(flag)},
            }
            for flag in HOSTILE
        },
    }


# how a hostile stand-in answers: an endless file list, an endless file (its listed size a lie),
# a file trickled a byte at a time past every deadline, endless safetensors headers, a redirect loop,
# a config nested 20,000 deep, a file list naming a config of 1 GB
HOSTILE = (
    "endless_api",
    "endless_file",
    "endless_index",
    "trickle_file",
    "endless_header",
    "redirect_loop",
    "deep_config",
    "huge_config",
)


def hostile_files(flag: str) -> dict[str, File]:
    n = ESTIMATE // 2
    f32 = {k: v for k, v in CONFIG.items() if k != "torch_dtype"}
    files = {
        "config.json": json_file(f32 if flag == "endless_header" else CONFIG),
        "model.safetensors": shard("BF16", n),
    }
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
        kind = (
            "api" if parts[0] == "api" else "resolve" if len(parts) > 3 and parts[2] == "resolve" else "other"
        )
        with self.lock:
            self.requests.append(
                {
                    "kind": kind,
                    "method": h.command,
                    "path": path,
                    "auth": auth,
                    "range": h.headers.get("Range"),
                }
            )
        try:
            if kind == "api" and parts[1] == "models":
                self.api(h, parts[2:], body)
            elif kind == "resolve":
                self.resolve(h, f"{parts[0]}/{parts[1]}", unquote(parts[3]), "/".join(parts[4:]), body, auth)
            else:
                self.reply(h, 404, b"{}", body, {"X-Error-Code": "RepoNotFound"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def reply(
        self,
        h: BaseHTTPRequestHandler,
        code: int,
        data: bytes,
        body: bool,
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def endless(
        self,
        h: BaseHTTPRequestHandler,
        code: int,
        headers: dict[str, str],
        first: bytes,
        chunk: bytes = b"a" * 65536,
        delay: float = 0.0,
        limit: int = 8 << 30,
    ) -> None:
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
            return self.reply(
                h, 404, b'{"error":"Repository not found"}', body, {"X-Error-Code": "RepoNotFound"}
            )
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
            s: dict[str, Any] = {
                "rfilename": name,
                "size": f.size,
                "blobId": hashlib.sha1(f.head).hexdigest(),
            }
            if f.lfs:
                s["lfs"] = {"size": f.size, "sha256": f.etag, "pointerSize": 134}
            siblings.append(s)
        doc = {
            "id": repo,
            "modelId": repo,
            "sha": sha,
            "private": False,
            "gated": "manual" if r.get("gated") else False,
            "siblings": siblings,
        }
        self.reply(h, 200, json.dumps(doc).encode(), body, {"Content-Type": "application/json"})

    def resolve(
        self, h: BaseHTTPRequestHandler, repo: str, rev: str, name: str, body: bool, auth: str
    ) -> None:
        r, sha = self.lookup(repo, rev)
        if r is None:
            return self.reply(h, 404, b"", body, {"X-Error-Code": "RepoNotFound"})
        if sha is None:
            return self.reply(h, 404, b"", body, {"X-Error-Code": "RevisionNotFound"})
        if r.get("gated") and auth != f"Bearer {TOKEN}":
            code = 403 if auth else 401
            return self.reply(
                h,
                code,
                b"",
                body,
                {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated", "X-Repo-Commit": sha},
            )
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
            return self.endless(
                h,
                206,
                {**headers, "Content-Range": f"bytes 0-{f.size - 1}/{f.size}"},
                struct.pack("<Q", 20_000_000) + b'{"a": "',
            )
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) + 1 if b else f.size, f.size)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
            return self.reply(h, 206, f.read(start, end), body, headers)
        if body and f.lfs:  # the weights themselves: hwprofile must never ask for them
            return self.reply(h, 500, b"", body, headers)
        self.reply(h, 200, f.read(0, f.size) if body else b"", body, headers, length=f.size)


def serve() -> Iterator[Hub]:
    """The stand-in Hub running (a fixture's body: ``yield from serve()``), closed after."""
    h = Hub()
    try:
        yield h
    finally:
        h.close()


def write_snapshot(host: Any, folder: Path) -> Path:
    """``host`` (a HostSnapshot) written to ``folder``/a100.json, the ``--from`` of :func:`plan`."""
    p = folder / "a100.json"
    p.write_text(host.to_json())
    return p


def hub_env(hub: Hub, home: Path, config_root: Path, etag_timeout: str) -> dict[str, str]:
    """This process's environment without any Hugging Face or proxy setting, pointed at ``hub`` with
    ``HF_HOME`` = ``home`` and huggingface_hub's ``HF_HUB_ETAG_TIMEOUT`` = ``etag_timeout``."""
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    e.update(
        {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(home),
            "HWPROFILE_CONFIG_ROOT": str(config_root),
            "HF_HUB_ETAG_TIMEOUT": etag_timeout,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    return e


def plan(
    snapshot: Path, env: dict[str, str], *args: str, json_out: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hwprofile", "plan", "--from", str(snapshot), *args]
    return subprocess.run(
        cmd + (["--json"] if json_out else []), env=env, capture_output=True, text=True, timeout=60
    )


def model_of(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["model"]


def files_of(hub: Hub, repo: str) -> dict[str, File]:
    r = hub.repos[repo]
    return r["commits"][r["refs"]["main"]]
