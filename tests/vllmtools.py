"""Run real vLLM (the CPU build) in tests: bounded KV cache, loopback only, own process group."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

VLLM = Path(sys.executable).parent / "vllm"
FAKE_VLLM = Path(__file__).resolve().parent / "fakevllm.py"  # the fake vLLM server of the fast tests
TINY_CONFIG = {
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


def fake_model(directory: Path) -> Path:
    """A model directory the planner reads (TINY_CONFIG and a token safetensors file) for the fake server."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    (directory / "model.safetensors").write_bytes(b"\0" * 4096)
    return directory


def fake_vllm_shim(path: Path, prelude: str = "") -> Path:
    """An executable ``vllm`` (for ``server.vllm_command``) that runs the fake server; ``prelude``:
    shell lines run first."""
    path.write_text(f'#!/bin/sh\n{prelude}exec "{sys.executable}" "{FAKE_VLLM}" "$@"\n')
    path.chmod(0o755)
    return path


def have_vllm() -> bool:
    from hwprofile.host.software import vllm_version

    return VLLM.exists() and vllm_version()[0] is not None


def require_vllm() -> None:
    """Skip without vLLM, except in CI (CI=true), where its absence is a failure."""
    if have_vllm():
        return
    msg = "real vLLM is not installed here: pip install -e '.[test,cpu]' && hwprofile doctor --fix"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections and ``bind(0)`` (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_TAKEN: set[int] = set()  # ports this worker handed out (a test may pick several before binding any)


def free_ports(n: int = 1) -> int:
    """A first port with ``n`` free consecutive ports after it (a host's instances take consecutive
    ports), picked at random below the kernel's ephemeral range: a port from ``bind(0)`` is in that
    range, where another worker's outgoing connection can take it (or the port after it) before the
    server under test binds it."""
    import random

    high = _ephemeral_low() - n
    for _ in range(200):
        base = random.randrange(10000, high) if high > 11000 else 0
        if base == 0:  # no room below the range: let the kernel choose
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
        ports = range(base, base + n)
        if base + n >= 65535 or any(q in _TAKEN for q in ports):
            continue
        try:
            for q in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        _TAKEN.update(ports)
        return base
    raise RuntimeError(f"no {n} free consecutive ports on 127.0.0.1")


def free_port() -> int:
    """One free port on 127.0.0.1 (see free_ports)."""
    return free_ports(1)


_SHORT: list[str] = []


def _short_tmp(workdir: Path) -> str:
    """``workdir``, or a short directory in /tmp when it is too long for vLLM's IPC socket paths
    (``TMPDIR/<uuid4>`` must fit in 107 bytes; pytest-xdist's tmp paths do not), removed at exit."""
    if len(str(workdir)) <= 60:
        return str(workdir)
    import atexit
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="hwpv-", dir="/tmp")
    if not _SHORT:
        atexit.register(lambda: [shutil.rmtree(x, ignore_errors=True) for x in _SHORT])
    _SHORT.append(d)
    return d


def cpu_env(workdir: Path) -> dict[str, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "TMPDIR": _short_tmp(workdir),
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor"),
    }


def serve(model: Path, port: int, args: list[str], workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"vllm-{port}.log"
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [str(VLLM), "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=cpu_env(workdir), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, log


def wait_for_log(
    proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout: float = 400
) -> re.Match[str]:
    rx = re.compile(pattern)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = rx.search(log.read_text(errors="replace"))
        if m:
            return m
        if proc.poll() is not None:
            raise AssertionError(
                f"vLLM exited {proc.returncode} before /{pattern}/:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.5)
    raise AssertionError(f"no /{pattern}/ within {timeout}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes], grace: float = 15) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


ENGINES = Path(__file__).resolve().parent / "vllm_engines.py"


def kv_args(max_len: int, budget: int, batched: int | None = None, seqs: int | None = None) -> list[str]:
    """``vllm serve`` arguments of a KV test: eager, ``budget`` bytes of KV cache, and the batching given
    (vLLM's defaults where None)."""
    args = ["--max-model-len", str(max_len), "--enforce-eager", "--kv-cache-memory-bytes", str(budget)]
    if batched is not None:
        args += ["--max-num-batched-tokens", str(batched)]
    if seqs is not None:
        args += ["--max-num-seqs", str(seqs)]
    return args


@dataclasses.dataclass(frozen=True)
class Settled:
    """What one real vLLM engine settled on (tests/vllm_engines.py): its KV cache's token capacity (the
    figure of its ``KV cache size: N tokens`` line), its block size (its prefix-cacheable groups'
    smallest), its full-attention layers' block (None: none), and its own part of the log."""

    kv_tokens: int
    block_size: int
    attention_block_size: int | None
    log: str


def engine_kv(
    cases: list[tuple[str, Path, list[str]]], workdir: Path, timeout: float = 400
) -> dict[str, Settled]:
    """Each case's engine as ``vllm serve <model> <args>`` builds it, without a server, one case after
    another, each in a process forked after one import of vLLM for them all (tests/vllm_engines.py),
    where a server starts three processes that each import it. Fails naming the case that did not
    build (or was not reached in ``timeout`` seconds and two minutes a case), with its log's tail."""
    names = [case for case, _, _ in cases]
    assert len(set(names)) == len(names) and not any("\n" in n for n in names), names
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "engines.log"
    env = {**cpu_env(workdir), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    spec = json.dumps([[case, str(model), args] for case, model, args in cases])
    limit = timeout + 120 * len(cases)
    timed_out = False
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ENGINES), spec],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            stop(proc)
    text = log.read_text(errors="replace")
    parts = re.split(r"^@@CASE (.+)\n", text, flags=re.M)
    logs = dict(zip(parts[1::2], parts[2::2], strict=True))
    settled = {}
    for case in names:
        part = logs.get(case)
        found = re.search(r"^@@KV (\{.*\})$", part or "", flags=re.M)
        got = json.loads(found.group(1)) if found else {}
        if got.get("case") != case or not isinstance(got.get("kv_tokens"), int):
            why = f"not reached in {limit:g} s" if timed_out and part is None else "did not build"
            tail = (part if part is not None else text)[-3000:]
            raise AssertionError(f"vLLM's engine for {case} {why} (runner exit {proc.returncode}):\n{tail}")
        settled[case] = Settled(got["kv_tokens"], got["block_size"], got["attention_block_size"], part or "")
    return settled


# -- random-weight models of real architectures (transformers' own classes) ----------------------

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
# every such model: the tiny tokenizer's vocabulary, room for the lengths the tests serve
FAMILY_COMMON: dict[str, Any] = {
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def make_transformers_model(
    out: Path, cfg_cls: str, model_cls: str, kwargs: dict[str, Any], tokenizer_dir: Path, seed: int = 1234
) -> Path:
    """A random-weight bf16 model of transformers' ``cfg_cls``/``model_cls`` (so config.json has the
    family's real keys) with ``kwargs`` over :data:`FAMILY_COMMON`, and the tiny tokenizer's files
    from ``tokenizer_dir`` (:func:`hwprofile.launch.tinymodel.make_tiny_model`), written to ``out``."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(
        **FAMILY_COMMON, **kwargs, bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="bfloat16"
    )
    model = getattr(transformers, model_cls)(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


# the tiny Qwen3-Next (GDN + gated attention + MoE) of issue 38: the plan tests and the layer tests
TINY_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 256,
    "vocab_size": 2048,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


# DeepSeek-V3's published shape (61 layers, 3 dense, MLA): the MLA/sparse-attention KV tests and the
# replicated-weight tests
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "intermediate_size": 18432,
    "first_k_dense_replace": 3,
    "vocab_size": 129280,
}

# a tiny LFM2 (3 gated short convolutions + 1 attention layer) for transformers' Lfm2Config: the
# weight tests and the real-vLLM KV tests
TINY_LFM2: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["conv", "conv", "full_attention", "conv"],
    "conv_L_cache": 3,
    "conv_dim": 128,
    "block_multiple_of": 64,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
}
