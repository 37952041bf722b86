"""Override layers, provenance, inheritance, and every kind of bad input: one clear message naming
the file and line, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import inproc
import pytest

from hwprofile.config.schema import parse_size
from hwprofile.pipeline import resolve_settings


def test_every_layer_in_order_with_provenance(host_of, empty_root, tmp_path) -> None:
    host = host_of("rtx4090-1x")
    (empty_root / "profiles").mkdir()
    (empty_root / "profiles" / "rtx4090-24g.yaml").write_text(  # shadows the built-in of that name
        "extends: base\ndescription: site copy\nengine:\n  max_model_len: 3000\n  max_num_seqs: 3\n  max_num_batched_tokens: 1024\n  gpu_memory_utilization: 0.8\n"
    )
    (empty_root / "overrides.d").mkdir()
    (empty_root / "overrides.d" / "10-a.yaml").write_text(
        "engine:\n  max_num_seqs: 4\n  max_num_batched_tokens: 1536\n"
    )
    (empty_root / "overrides.d" / "20-b.yaml").write_text(
        "engine:\n  max_num_batched_tokens: 1600\n  enforce_eager: true\n"
    )
    user = tmp_path / "mine.yaml"
    user.write_text("# mine\nengine:\n  enforce_eager: false\n  gpu_memory_utilization: 0.85\n")
    env = {
        "HWPROFILE_ENGINE__GPU_MEMORY_UTILIZATION": "0.87",
        "HWPROFILE_PROC_ROOT": "/ignored",
        "HWPROFILE_SPECULATIVE__METHOD": "ngram",
    }
    res = resolve_settings(
        host,
        empty_root,
        overrides=[str(user)],
        sets=["speculative.method=none", "kv_cache_dtype=fp8"],
        environ=env,
    )
    e = res.settings.engine
    assert res.profile == "rtx4090-24g" and res.chain[-1].kind == "etc-profile"
    assert (e.max_model_len, e.max_num_seqs, e.max_num_batched_tokens) == (3000, 4, 1600)
    assert (e.enforce_eager, e.gpu_memory_utilization, e.kv_cache_dtype) == (False, 0.87, "fp8")
    assert res.settings.speculative.method == "none"
    p = {".".join(k): str(v) for k, v in res.provenance.items()}
    assert p["engine.max_model_len"] == f"etc-profile {empty_root}/profiles/rtx4090-24g.yaml:4"
    assert p["engine.max_num_seqs"] == f"overrides.d {empty_root}/overrides.d/10-a.yaml:2"
    assert p["engine.max_num_batched_tokens"] == f"overrides.d {empty_root}/overrides.d/20-b.yaml:2"
    assert p["engine.enforce_eager"] == f"overrides {user}:3"
    assert p["engine.gpu_memory_utilization"] == "env HWPROFILE_ENGINE__GPU_MEMORY_UTILIZATION"
    assert p["speculative.method"] == "cli --set speculative.method=none"
    assert p["engine.kv_cache_dtype"] == "cli --set kv_cache_dtype=fp8"
    from hwprofile.match.profiles import builtin_dir

    base = Path(builtin_dir()) / "base.yaml"
    line = next(n for n, t in enumerate(base.read_text().splitlines(), 1) if "enable_prefix_caching" in t)
    assert p["engine.enable_prefix_caching"] == f"builtin {base}:{line}"


def test_replace_and_drop(host_of, empty_root) -> None:
    (empty_root / "profiles").mkdir()
    (empty_root / "profiles" / "site.yaml").write_text(
        "extends: rtx4090-24g\nspeculative:\n  _replace: true\n  method: ngram\nengine:\n  _drop: [kv_cache_dtype]\n"
    )
    res = resolve_settings(host_of("rtx4090-1x"), empty_root, profile="site", environ={})
    assert res.merged["speculative"] == {"method": "ngram"}  # the parents' section is gone
    assert "kv_cache_dtype" not in res.merged["engine"]
    assert res.merged["engine"]["max_num_seqs"] == 6  # the rest still merges
    assert ("speculative", "num_speculative_tokens") not in res.provenance
    # typed, what the layers left out is at its declared default
    assert (
        res.settings.speculative.num_speculative_tokens == 5 and res.settings.engine.kv_cache_dtype == "auto"
    )
    assert res.settings.engine.max_num_seqs == 6


def test_sizes() -> None:
    assert parse_size("64M") == 64_000_000 and parse_size("64MiB") == 64 * 2**20
    assert parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size(1024) == 1024
    with pytest.raises(ValueError):
        parse_size("lots")


# -- bad input, through the CLI ---------------------------------------------------------------


def _plan(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return inproc.hwprofile(["plan", *args], env)


@pytest.fixture
def cli(tmp_path, fake_nvml_dir, empty_root):
    from fakehost import build

    host = build("rtx4090-1x", tmp_path / "h")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    return lambda args, extra=None: _plan(args, {**env, **(extra or {})})


def _write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


CASES = [
    ("yaml syntax", "overrides.d/a.yaml", "engine:\n  max_model_len: [1, 2\n", [], "a.yaml:3: invalid YAML"),
    (
        "unknown key",
        "overrides.d/a.yaml",
        "engine:\n  max_model_lenn: 4096\n",
        [],
        "a.yaml:2: unknown key 'engine.max_model_lenn' (did you mean 'max_model_len'?)",
    ),
    (
        "unknown section",
        "overrides.d/a.yaml",
        "engin:\n  max_model_len: 4096\n",
        [],
        "a.yaml:1: unknown key 'engin' (did you mean 'engine'?)",
    ),
    (
        "wrong type",
        "overrides.d/a.yaml",
        "\nengine:\n  max_num_seqs: many\n",
        [],
        "a.yaml:3: engine.max_num_seqs: expected an integer, got 'many'",
    ),
    (
        "out of range",
        "overrides.d/a.yaml",
        "engine:\n  gpu_memory_utilization: 1.5\n",
        [],
        "a.yaml:2: engine.gpu_memory_utilization: 1.5 is out of range [0.05, 0.99]",
    ),
    (
        "bad choice",
        "overrides.d/a.yaml",
        "engine:\n  kv_cache_dtype: fp16\n",
        [],
        "'fp16' is not one of: auto, fp8_if_supported, fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16 (did you mean 'float16'?)",
    ),
    (
        "unknown parent",
        "profiles/x.yaml",
        "extends: bsae\n",
        ["--profile", "x"],
        "x.yaml:1: unknown parent profile 'bsae' (did you mean 'base'?)",
    ),
    (
        "cycle",
        "profiles/x.yaml",
        "extends: y\n",
        ["--profile", "x"],
        "profile inheritance cycle: x -> y -> x",
    ),
    (
        "unknown profile",
        None,
        None,
        ["--profile", "rtx4909-24g"],
        "unknown profile 'rtx4909-24g' (did you mean 'rtx4090-24g'?)",
    ),
    (
        "missing model dir",
        None,
        None,
        ["--model", "/nonexistent/model"],
        "model /nonexistent/model: no such model directory",
    ),
    (
        "bad --set key",
        None,
        None,
        ["--set", "engine.max_num_seq=3"],
        "--set engine.max_num_seq=3: unknown setting 'engine.max_num_seq' (did you mean 'engine.max_num_seqs'?)",
    ),
    (
        "bad --set value",
        None,
        None,
        ["--set", "max_num_seqs=-1"],
        "--set max_num_seqs=-1: engine.max_num_seqs: -1 is out of range [1, 65536]",
    ),
    ("missing overrides", None, None, ["--overrides", "/nope.yaml"], "--overrides /nope.yaml: no such file"),
]


@pytest.mark.parametrize(("what", "rel", "text", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(cli, empty_root, what, rel, text, args, message) -> None:
    if rel:
        _write(empty_root, rel, text)
    if what == "cycle":
        _write(empty_root, "profiles/y.yaml", "extends: x\n")
    r = cli(args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_env_and_unreadable_config_json(cli, tmp_path) -> None:
    r = cli([], {"HWPROFILE_ENGINE__MAX_MODEL_LENN": "4"})
    assert (
        r.returncode == 2
        and "environment HWPROFILE_ENGINE__MAX_MODEL_LENN: unknown setting (did you mean 'HWPROFILE_ENGINE__MAX_MODEL_LEN'?)"
        in r.stderr
    )
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.json").write_text('{\n  "hidden_size": 128,\n  oops\n}')
    r = cli(["--model", str(model)])
    assert r.returncode == 2 and f"{model}/config.json:3: invalid JSON" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli(["--model", str(empty)])
    assert r.returncode == 2 and "no config.json in the model directory" in r.stderr


def test_several_problems_are_all_reported(cli, empty_root) -> None:
    _write(
        empty_root,
        "overrides.d/a.yaml",
        "engine:\n  max_num_seqs: 0\n  dtype: half\nlayout:\n  replicas: two\n",
    )
    r = cli([])
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hwprofile: error:")]
    assert [ln.split("a.yaml:")[1].split(":")[0] for ln in lines] == ["2", "3", "5"]
