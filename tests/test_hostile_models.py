"""Hostile model folders (config.json, safetensors index) and model options: one clear error
naming the file and key, exit 2, nothing on stdout, never a traceback or a plan.

The corpus is ``tests/hostile/models.json``: each case edits a tiny valid config.json (``set``,
``del``), adds files (``files``), is built here (``gen``) or passes options (``args``); ``expect``
is a part of the error message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import inproc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hwprofile.config import ConfigError
from hwprofile.model import checkpoint_bytes, parse_config, read_model_dir, resolve_model

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "hostile"
HOST = HOSTILE / "host-base.json"
CASES: list[dict[str, Any]] = json.loads((HOSTILE / "models.json").read_text())
TINY: dict[str, Any] = {
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


def make_model(case: dict[str, Any], d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**TINY, **case.get("set", {})}
    for k in case.get("del", ()):
        cfg.pop(k)
    gen = case.get("gen")
    text = json.dumps(cfg).encode()
    if gen == "latin1":
        text = json.dumps({**cfg, "model_type": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
    elif gen == "not-json":
        text = b"{oops"
    elif gen == "list":
        text = b"[1, 2]"
    elif gen == "deep":
        text = json.dumps(cfg)[:-1].encode() + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if gen != "no-config":
        (d / "config.json").write_bytes(text)
    for name, content in case.get("files", {}).items():
        (d / name).write_text(content if isinstance(content, str) else json.dumps(content))


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwprofile", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def env(empty_root: Path, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HWPROFILE_CONFIG_ROOT": str(empty_root),
        "HF_HUB_CACHE": str(tmp_path / "no-hub"),
    }


def test_corpus_is_large_and_named() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


def test_tiny_model_plans(env: dict[str, str], tmp_path: Path) -> None:
    make_model({}, tmp_path / "m")
    r = _cli(["plan", "--from", str(HOST), "--model", str(tmp_path / "m"), "--json"], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["path"] == str(tmp_path / "m")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hostile_model_is_one_clear_error(case: dict[str, Any], env: dict[str, str], tmp_path: Path) -> None:
    model = tmp_path / "m"
    make_model(case, model)
    args = case.get("args") or []
    if "--model" not in args:
        args = ["--model", str(model), *args]
    r = inproc.hwprofile(["plan", "--from", str(HOST), *args, "--json"], env)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:], r.stdout[-500:])
    assert "Traceback" not in r.stderr
    assert r.stdout == "", "nothing half-done on stdout"
    assert r.stderr.startswith("hwprofile: error: ") and r.stderr.count("hwprofile: error:") == 1, r.stderr
    assert case["expect"] in r.stderr, r.stderr


@pytest.mark.parametrize("case", CASES[::10], ids=[c["id"] for c in CASES[::10]])
def test_the_in_process_cli_is_the_cli(case: dict[str, Any], env: dict[str, str], tmp_path: Path) -> None:
    """The corpus runs in this process (tests/inproc.py); a sample of it run both ways says the same."""
    make_model(case, tmp_path / "m")
    args = case.get("args") or []
    if "--model" not in args:
        args = ["--model", str(tmp_path / "m"), *args]
    args = ["plan", "--from", str(HOST), *args, "--json"]
    a, b = _cli(args, env), inproc.hwprofile(args, env)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_catalog_still_parses() -> None:
    from hwprofile.model import catalog_models, catalog_names

    assert len(catalog_models()) == len(catalog_names())


# -- fuzzing, in process -----------------------------------------------------------------------

KEYS = [
    *TINY,
    "head_dim",
    "tie_word_embeddings",
    "sliding_window",
    "use_sliding_window",
    "sliding_window_pattern",
    "layer_types",
    "quantization_config",
    "num_experts",
    "n_routed_experts",
    "num_local_experts",
    "moe_intermediate_size",
    "n_shared_experts",
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "text_config",
    "dtype",
]
SHARP = st.sampled_from(
    [-1, 0, 1, 2, 3, 4, 8, 2**31, 2**70, 1.5, "", "4", "false", "awq", None, True, False, [], {}]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | SHARP,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["bits", "w_bit", "quant_method", *KEYS[:6]]) | st.text(max_size=4),
            inner,
            max_size=3,
        )
    ),
    max_leaves=6,
)
CONFIGS = st.builds(
    lambda edits, drops: {**{k: v for k, v in TINY.items() if k not in drops}, **dict(edits)},
    st.lists(st.tuples(st.sampled_from(KEYS), JSON_VALUES), max_size=4),
    st.sets(st.sampled_from(list(TINY)), max_size=2),
)


@settings(max_examples=500, deadline=2000)
@given(cfg=CONFIGS)
def test_fuzz_parse_config_only_raises_value_error(cfg: dict[str, Any]) -> None:
    try:
        m = parse_config(cfg, "fuzz", "dir", None)
    except ValueError as e:
        assert str(e).split(":")[0], e  # names the key
        return
    assert m.num_layers >= 1 and m.hidden_size >= 1 and m.head_dim >= 1
    assert 1 <= m.num_kv_heads <= m.num_heads and m.num_heads % m.num_kv_heads == 0
    assert 0 <= m.sliding_layers <= m.num_layers and m.full_layers >= 0
    assert m.params > 0 and m.weights_bytes > 0 and m.bits >= 1
    assert m.max_position_embeddings is None or m.max_position_embeddings >= 1
    assert isinstance(m.tie_word_embeddings, bool)


@settings(max_examples=200, deadline=2000)
@given(
    config=st.one_of(st.binary(max_size=200), CONFIGS.map(lambda c: json.dumps(c).encode())),
    index=st.one_of(st.none(), st.binary(max_size=100), JSON_VALUES.map(lambda v: json.dumps(v).encode())),
)
def test_fuzz_model_dir_only_raises_config_error(config: bytes, index: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "config.json").write_bytes(config)
        if index is not None:
            Path(d, "model.safetensors.index.json").write_bytes(index)
        try:
            m = read_model_dir(d)
        except ConfigError as e:
            assert e.problems and d in e.problems[0]
            return
        assert m.weights_bytes > 0
        size, how = checkpoint_bytes(d)
        assert size >= 0 and how


@settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.text(max_size=12))
@example(spec="~\x00")  # os.path.expanduser raised a bare ValueError on it
def test_fuzz_model_spec_only_raises_config_error(spec: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv(
        "HF_HUB_OFFLINE", "1"
    )  # an ORG/NAME spec ('0/0') is a Hub name: never ask the real Hub
    try:
        resolve_model(spec)
    except ConfigError as e:
        assert e.problems
