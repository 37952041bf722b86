"""Rendering for the vLLM release that will run the plan: golden argv per seed-class host and release,
every flag and value checked against the flag table read off vLLM's own parsers, systemd units that
pass systemd-analyze, and the API key kept out of everything but a 0600 env file."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import inproc
import pytest
from system import analyze_verify, need

from hwprofile.pipeline import make_plan
from hwprofile.render.translate import render_instance
from hwprofile.render.versions import parse_version, release

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "render"
VERSIONS = ["0.6.3", "0.8.5", "0.11.0", "0.15.0", "0.20.0", "0.25.0", "0.33.0"]
HOSTS = {  # seed-class fixture host → model planned on it
    "a800-pcie-4x-2numa": None,
    "rtx4090-1x": None,
    "rtx3060-12g-1x": "Qwen/Qwen3-8B",
    "rtx4070-12g-1x": "Qwen/Qwen3-8B",
    "rtx3090-2x": None,
    "a100-80g-pcie-1x": None,
    "no-driver": "Qwen/Qwen3-0.6B",
}


def _facts() -> tuple[dict, dict]:
    """The flag table straight from the shared facts (read off each release's parser)."""
    shared = ROOT.parent / "shared" / "facts"
    if not (shared / "vllm-options.json").is_file():
        # the renderer's own table would be an oracle that cannot disagree with the renderer
        pytest.skip("../shared/facts is not beside this checkout: no independent oracle")
    opts = json.loads((shared / "vllm-options.json").read_text())["options"]
    flags = json.loads((shared / "vllm-flags.json").read_text())
    return opts, flags


def _render_all(host, empty_root, model) -> dict:
    host = host._replace(software=host.software._replace(numactl_path="/usr/bin/numactl"))
    plan = make_plan(host, empty_root, model=model, sets=["server.vllm_command=vllm"], environ={})
    out = {}
    for v in VERSIONS:
        rel = release(v)
        out[v] = {}
        for inst in plan.instances:
            r = render_instance(plan, inst, rel, "vllm", "/usr/bin/numactl")
            out[v][inst.name] = {"argv": r.argv, "env": r.env, "warnings": r.warnings}
    return out


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_golden_render(name, host_of, empty_root) -> None:
    got = _render_all(host_of(name), empty_root, HOSTS[name])
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert path.exists(), f"no golden file {path}: UPDATE_GOLDEN=1 writes it (then review the diff)"
    assert got == json.loads(path.read_text()), f"render changed; UPDATE_GOLDEN=1 to accept ({path})"


def _flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    i = argv.index("serve") + 2  # after: vllm serve MODEL
    out: list[tuple[str, list[str]]] = []
    for tok in argv[i:]:
        if tok.startswith("--"):
            out.append((tok, []))
        else:
            out[-1][1].append(tok)
    return out


def test_every_golden_argv_is_valid_for_its_release() -> None:
    options, flags = _facts()
    spec_versions = sorted(
        (v for v in flags["speculative_config"] if isinstance(flags["speculative_config"][v], dict)),
        key=parse_version,
    )
    checked = 0
    for path in sorted(GOLDEN.glob("*.json")):
        for version, instances in json.loads(path.read_text()).items():
            opts = options[version]
            for name, r in instances.items():
                where = f"{path.name} {version} {name}"
                argv = r["argv"]
                if argv[0].endswith("numactl"):
                    assert argv[1:4] == [argv[1], argv[2], "--"] and argv[1].startswith("--cpunodebind=")
                for flag, values in _flags(argv):
                    assert flag in opts, f"{where}: {flag} does not exist in vLLM {version}"
                    allowed = opts[flag]
                    advisory = (flags["flags"].get(flag) or {}).get(version)
                    for allowed_values in (allowed, advisory):
                        if isinstance(allowed_values, list):
                            assert all(v in allowed_values for v in values), (
                                f"{where}: {flag} {values} not in {allowed_values}"
                            )
                    if flag == "--speculative-config":
                        cfg = json.loads(values[0])
                        older = [s for s in spec_versions if parse_version(s) <= parse_version(version)]
                        if older:
                            table = flags["speculative_config"][older[-1]]
                            assert set(cfg) <= set(table["keys"]), f"{where}: {set(cfg) - set(table['keys'])}"
                            assert cfg["method"] in table["methods"], where
                    checked += 1
    assert checked > 500  # 7 hosts x 7 releases x their flags


def test_translations_by_release(host_of, empty_root) -> None:
    got = _render_all(host_of("a800-pcie-4x-2numa"), empty_root, None)
    argv = {v: got[v]["vllm-gpu0-1"]["argv"] for v in VERSIONS}
    # speculative decoding: legacy flags before 0.8.2, JSON after; no draft model on V1 0.10-0.14
    assert "--speculative-model" in argv["0.6.3"] and "--speculative-config" not in argv["0.6.3"]
    spec = {
        v: json.loads(a[a.index("--speculative-config") + 1])
        for v, a in argv.items()
        if "--speculative-config" in a
    }
    assert spec["0.11.0"]["method"] == "ngram" and "model" not in spec["0.11.0"]
    assert spec["0.15.0"]["method"] == "draft_model" and spec["0.15.0"]["model"] == "Qwen/Qwen3-1.7B"
    # 0.20 has neither k by batch size nor disable_by_batch_size (gone in 0.18, unknown keys rejected):
    # a fixed k, the k of the widest band that still speculates ([9, 64] -> 3)
    assert spec["0.20.0"] == {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": "Qwen/Qwen3-1.7B",
    }
    # 0.15 accepts disable_by_batch_size but never reads it: not emitted, a fixed k, and said so
    assert "disable_by_batch_size" not in spec["0.15.0"] and spec["0.15.0"]["num_speculative_tokens"] == 3
    assert any("never reads it" in w for w in got["0.15.0"]["vllm-gpu0-1"]["warnings"])
    # V0 (0.8.5) honours it: light-load k 5, speculation off from batch 65
    assert spec["0.8.5"]["disable_by_batch_size"] == 65 and spec["0.8.5"]["num_speculative_tokens"] == 5
    # 0.6.3 refuses chunked prefill with speculation: left off, batched tokens >= max_model_len
    a63 = argv["0.6.3"]
    assert "--enable-chunked-prefill" not in a63
    assert int(a63[a63.index("--max-num-batched-tokens") + 1]) >= int(a63[a63.index("--max-model-len") + 1])
    assert not any("draft_tensor_parallel_size" in s for s in spec.values())
    assert "--speculative-draft-tensor-parallel-size" not in a63
    # 0.33 takes the bands themselves, the last one up to the instance's max_num_seqs
    a33 = argv["0.33.0"]
    seqs = int(a33[a33.index("--max-num-seqs") + 1])
    assert spec["0.33.0"]["num_speculative_tokens_per_batch_size"] == [[1, 8, 5], [9, 64, 3], [65, seqs, 1]]
    # NUMA: numactl in front before 0.20, vLLM's own binding from 0.20
    assert argv["0.15.0"][:4] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--"]
    assert argv["0.20.0"][0] == "vllm" and argv["0.20.0"][-3:] == ["--numa-bind-nodes", "0", "0"]
    # flags that only exist from some release on
    assert "--shutdown-timeout" not in argv["0.15.0"] and "--shutdown-timeout" in argv["0.20.0"]
    for a in argv.values():
        assert "--disable-log-stats" not in a  # metrics are watched
        assert "--use-v2-block-manager" not in a and "--swap-space" not in a
    warnings = got["0.11.0"]["vllm-gpu0-1"]["warnings"]
    assert any("no draft-model speculation" in w for w in warnings)


def test_kv_dtype_only_from_the_release_choices(host_of, empty_root) -> None:
    got = _render_all(host_of("rtx4090-1x"), empty_root, None)
    for v in VERSIONS:
        a = got[v]["vllm-gpu0"]["argv"]
        assert a[a.index("--kv-cache-dtype") + 1] == "fp8"
    host = host_of("rtx3060-12g-1x")
    plan = make_plan(
        host, empty_root, model="Qwen/Qwen3-8B", sets=["engine.kv_cache_dtype=float16"], environ={}
    )
    old = render_instance(plan, plan.instances[0], release("0.15.0"), "vllm", None)
    new = render_instance(plan, plan.instances[0], release("0.20.0"), "vllm", None)
    assert "--kv-cache-dtype" not in old.argv and any(
        "float16 is not accepted by vLLM 0.15.0" in w for w in old.warnings
    )
    assert new.argv[new.argv.index("--kv-cache-dtype") + 1] == "float16"


def test_version_between_tables_uses_the_older(host_of) -> None:
    r = release("0.17.1")
    assert r.table == "0.16.0" and "nearest older" in r.note
    assert release("0.32.0+cpu").table == "0.32.0" and release("0.32.0+cpu").note is None


def _cli(args, env):
    return inproc.hwprofile(args, env)


@pytest.fixture
def cli_env(tmp_path, fake_nvml_dir, empty_root):
    from fakehost import build

    def make(name):
        host = build(name, tmp_path / name)
        return {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}

    return make


def test_api_key_only_in_the_0600_env_file(cli_env, tmp_path) -> None:
    env = {
        **cli_env("a800-pcie-4x-2numa"),
        "HWPROFILE_SERVER__API_KEY_ENV": "MY_VLLM_KEY",
        "MY_VLLM_KEY": "s3cret-key-value",
    }
    base = ["render", "--vllm-version", "0.33.0", "--instance", "vllm-gpu0-1"]
    for fmt in ("argv", "shell", "yaml", "systemd", "json", "env"):
        r = _cli([*base, "--format", fmt], env)
        assert r.returncode == 0, r.stderr
        assert "s3cret-key-value" not in r.stdout + r.stderr, fmt
        assert "--api-key" not in r.stdout
    assert "# VLLM_API_KEY comes from $MY_VLLM_KEY" in _cli([*base, "--format", "env"], env).stdout
    out = tmp_path / "out"
    r = _cli([*base, "--format", "env", "--output", str(out)], env)
    assert r.returncode == 0, r.stderr
    f = out / "vllm-gpu0-1.env"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert "VLLM_API_KEY=s3cret-key-value" in f.read_text()
    missing = {k: v for k, v in env.items() if k != "MY_VLLM_KEY"}
    r = _cli([*base, "--format", "env", "--output", str(out)], missing)
    assert r.returncode == 2 and "MY_VLLM_KEY, which is not set" in r.stderr


def test_default_bind_is_loopback_and_argv_is_a_list(cli_env) -> None:
    r = _cli(["render", "--vllm-version", "0.20.0", "--format", "argv"], cli_env("rtx4090-1x"))
    assert r.returncode == 0, r.stderr
    (argv,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_templates_fail_on_undefined_values(host_of, empty_root) -> None:
    import jinja2

    from hwprofile.render.output import environment

    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("vllm-instance.service.j2").render(name="x")


@pytest.mark.parametrize(
    ("host", "version"),
    [
        ("a800-pcie-4x-2numa", "0.15.0"),
        ("a800-pcie-4x-2numa", "0.33.0"),
        ("no-driver", "0.33.0"),
        ("rtx3090-2x", "0.8.5"),
    ],
)
def test_units_pass_systemd_analyze_verify(cli_env, tmp_path, host, version) -> None:
    env = cli_env(host)
    envfile = tmp_path / "inst.env"
    envfile.write_text("VLLM_NO_USAGE_STATS=1\n")
    vllm = Path(sys.executable).parent / "vllm"
    exe = str(vllm if vllm.exists() else Path(sys.executable))
    args = [
        "render",
        "--vllm-version",
        version,
        "--format",
        "systemd",
        "--env-file",
        str(envfile),
        "--set",
        f"server.vllm_command={exe}",
        "--output",
        str(tmp_path / "units"),
    ]
    if host == "no-driver":
        args += ["--model", "Qwen/Qwen3-0.6B"]
    r = _cli(args, env)
    assert r.returncode == 0, r.stderr
    units = sorted((tmp_path / "units").glob("*.service"))
    assert units
    for unit in units:
        v = analyze_verify(unit)
        assert v.returncode == 0 and v.stderr == "", (unit.read_text(), v.stderr)
        # The overall exposure (0 safe ... 10 unsafe) from the text: --threshold's scale differs by
        # systemd release (0-100 on 252), the printed figure does not.
        sec = subprocess.run(
            [need("systemd-analyze"), "security", "--offline=true", str(unit)], capture_output=True, text=True
        )
        m = re.search(r"Overall exposure level for .*: ([\d.]+)", sec.stdout)
        assert m and float(m.group(1)) <= 4.0, sec.stdout[-3000:]
