"""Every seed-class host x every one of the 26 vLLM releases, rendered and checked against the shared
facts (../shared/facts/vllm-options.json and vllm-flags.json, read off each release's own source).

The oracle reads the facts' own words (status texts, refusal rules) with its own small
interpretation; it never uses the renderer's table (hwprofile/data/vllm.json). A render fails it
when vLLM would refuse it at start (unknown flag or key, a value outside the release's choices, a
combination the release rejects) or when it emits a setting that release silently ignores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from test_render import _flags  # one argv splitter for both render tests

from hwprofile.config import ConfigError
from hwprofile.pipeline import make_plan
from hwprofile.plan.refusal import PlanRefused
from hwprofile.plan.types import InstancePlan
from hwprofile.render.translate import render_instance
from hwprofile.render.versions import known_versions, release

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT.parent / "shared" / "facts"
pytestmark = pytest.mark.skipif(
    not (FACTS / "vllm-flags.json").is_file(), reason="../shared/facts is not beside this checkout"
)

HOSTS = {  # every fixture host -> the model planned on it (None: the profile's default)
    "a800-pcie-4x-2numa": None,
    "a800-sxm4-80g-8x": None,
    "a100-sxm4-80g-8x": None,
    "a100-80g-pcie-1x": None,
    "a100-40g-pcie-1x": None,
    "h100-sxm-8x": None,
    "rtx4090-1x": None,
    "rtx3090-2x": None,
    "rtx3060-12g-1x": "Qwen/Qwen3-8B",
    "rtx4070-12g-1x": "Qwen/Qwen3-8B",
    "gpu-lost-2x": None,
    "no-driver": "Qwen/Qwen3-0.6B",
}


def _facts() -> tuple[dict, dict]:
    options = json.loads((FACTS / "vllm-options.json").read_text())["options"]
    flags = json.loads((FACTS / "vllm-flags.json").read_text())
    return options, flags


def oracle(version: str, argv: list[str], env: dict[str, str], inst: dict) -> tuple[list[str], int]:
    """(problems, checks made) for one rendered instance, judged by the facts alone."""
    options, facts = _facts()
    opts = options[version]
    spec_facts = facts["speculative_config"][version]
    problems: list[str] = []
    checks = 0
    flags = _flags(argv)
    given = dict(flags)
    for flag, values in flags:
        checks += 1
        if flag not in opts:
            problems.append(f"refused: {flag} does not exist in vLLM {version}")
            continue
        for allowed in (opts[flag], (facts["flags"].get(flag) or {}).get(version)):
            if isinstance(allowed, list) and not all(v in allowed for v in values):
                problems.append(f"refused: {flag} {values} not in {allowed}")

    honoured = {k: v["status"] for k, v in spec_facts["honoured"].items()}
    constraints = spec_facts["constraints"]
    spec: dict | None = None
    if "--speculative-config" in given:
        spec = json.loads(given["--speculative-config"][0])
        unknown = set(spec) - set(spec_facts["keys"])
        checks += 1
        if unknown and spec_facts["unknown_keys"]["status"] == "rejected":
            problems.append(
                f"refused: speculative keys {sorted(unknown)} (vLLM {version} rejects unknown keys)"
            )
        elif unknown:
            problems.append(
                f"silently ignored: speculative keys {sorted(unknown)} (dropped by vLLM {version})"
            )
        if spec["method"] not in spec_facts["methods"]:
            problems.append(f"refused: speculative method {spec['method']} not in vLLM {version}")
    elif "--speculative-model" in given:
        model = given["--speculative-model"][0]
        spec = {"method": "ngram" if model == "[ngram]" else "draft_model"}
        if "--speculative-disable-by-batch-size" in given:
            spec["disable_by_batch_size"] = int(given["--speculative-disable-by-batch-size"][0])
        if "--speculative-draft-tensor-parallel-size" in given:
            spec["draft_tensor_parallel_size"] = int(given["--speculative-draft-tensor-parallel-size"][0])
    speculating = spec is not None

    if speculating:
        checks += 1
        # load protection: only where the release reads it (for the method used)
        if "disable_by_batch_size" in spec:
            status = honoured["disable_by_batch_size"]
            ok = status.startswith("honoured") and (
                "only on V0 (draft_model" not in status or spec["method"] == "draft_model"
            )
            if version == "0.8.2" and "--speculative-config" in given:
                ok = False  # honoured with the legacy flag only
            if not ok:
                problems.append(f"silently ignored: disable_by_batch_size on vLLM {version} ({status})")
        if "num_speculative_tokens_per_batch_size" in spec and honoured[
            "num_speculative_tokens_per_batch_size"
        ].startswith("absent"):
            problems.append(f"refused: num_speculative_tokens_per_batch_size on vLLM {version}")
        # draft models at all, and the draft's tensor parallel size
        if spec["method"] == "draft_model" and "no separate draft models" in constraints.get(
            "draft_vocab", ""
        ):
            problems.append(f"refused: draft_model on vLLM {version} (no separate draft models)")
        dtp = spec.get("draft_tensor_parallel_size")
        if dtp is not None:
            tp = inst["tensor_parallel_size"]
            if "must be 1 if passed" in constraints["draft_tensor_parallel_size"] and dtp != 1:
                problems.append(f"refused: draft TP {dtp} on vLLM {version} (must be 1 if passed)")
            elif "requires == target TP" in constraints["draft_tensor_parallel_size"] and dtp != tp:
                problems.append(f"refused: draft TP {dtp} != target TP {tp} on vLLM {version}")
        # chunked prefill together with speculation
        cp = constraints["chunked_prefill_with_speculation"]["status"]
        if cp == "refused" and "--enable-chunked-prefill" in given:
            problems.append(f"refused: chunked prefill with speculation on vLLM {version}")
        if (
            cp.startswith("ok, with two exceptions")
            and "--enable-chunked-prefill" in given
            and spec["method"] == "draft_model"
            and inst["tensor_parallel_size"] > 1
            and spec.get("draft_tensor_parallel_size") != 1
        ):
            problems.append(f"refused: chunked prefill with a draft TP != 1 on vLLM {version}")
        # the CPU backend
        if inst["device"] == "cpu":
            cpu = constraints["cpu_backend"]["status"]
            ok = cpu.startswith("ok") or (cpu.startswith("refused on V1") and spec["method"] == "draft_model")
            if not ok:
                kind = "silently ignored" if cpu == "not applied" else "refused"
                problems.append(f"{kind}: speculation on vLLM {version}'s CPU backend ({cpu})")

    # without chunked prefill a batch must hold a whole prompt
    chunked_off = "--no-enable-chunked-prefill" in given or (
        speculating
        and constraints["chunked_prefill_with_speculation"]["status"] == "refused"
        and "--enable-chunked-prefill" not in given
    )
    if chunked_off and "--max-num-batched-tokens" in given:
        checks += 1
        mnbt = int(given["--max-num-batched-tokens"][0])
        if mnbt < int(given["--max-model-len"][0]):
            problems.append(
                f"refused: --max-num-batched-tokens {mnbt} < --max-model-len without chunked prefill"
            )

    # AWQ: an explicit 'awq' forces the slow legacy kernel where the release says so
    if given.get("--quantization") == ["awq"] and spec_facts["awq"]["quantization_awq_forces_legacy_kernel"]:
        problems.append(f"slow: --quantization awq forces the legacy AWQ kernel on vLLM {version}")

    # NUMA binding: one node per visible GPU
    if "--numa-bind-nodes" in given:
        checks += 1
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
        if "--numa-bind" not in given or len(given["--numa-bind-nodes"]) != len(visible):
            problems.append(f"refused: --numa-bind-nodes {given['--numa-bind-nodes']} for GPUs {visible}")
    return problems, checks


def _render_everything(host_of, empty_root, name: str, model: str | None, sets: list[str] | None = None):
    host = host_of(name)
    host = host._replace(software=host.software._replace(numactl_path="/usr/bin/numactl"))
    typed = make_plan(
        host, empty_root, model=model, sets=["server.vllm_command=vllm", *(sets or [])], environ={}
    )
    plan = typed.to_json()  # the oracle reads the plan's contract
    for version in known_versions():
        rel = release(version)
        assert rel.table == version
        for inst, ti in zip(plan["instances"], typed.instances, strict=True):
            yield version, inst, render_instance(typed, ti, rel, "vllm", "/usr/bin/numactl")


def test_facts_cover_the_shipped_releases() -> None:
    options, facts = _facts()
    assert sorted(options) == sorted(known_versions()) == sorted(facts["speculative_config"])


def test_shipped_speculative_table_matches_the_facts() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_vllm_table.py"), "--check", "--facts", str(FACTS)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_every_release_accepts_and_honours_the_render(name, host_of, empty_root) -> None:
    problems: list[str] = []
    checks = renders = 0
    for version, inst, r in _render_everything(host_of, empty_root, name, HOSTS[name]):
        found, n = oracle(version, r.argv, r.env, inst)
        problems += [f"{version} {inst['name']}: {p}" for p in found]
        checks += n
        renders += 1
    assert not problems, "\n".join(problems)
    assert renders >= len(known_versions()) and checks > renders * 5


def test_the_oracle_catches_what_the_old_renderer_emitted() -> None:
    """The oracle is not true by construction: the renders of the last landed renderer fail it."""
    inst = {"tensor_parallel_size": 2, "device": "cuda"}
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    base = ["vllm", "serve", "M", "--max-model-len", "8192", "--max-num-batched-tokens", "8192"]
    spec20 = '{"method":"draft_model","num_speculative_tokens":5,"model":"D","disable_by_batch_size":65}'
    assert any(
        "refused" in p for p in oracle("0.20.0", [*base, "--speculative-config", spec20], env, inst)[0]
    )
    assert any(
        "silently ignored" in p
        for p in oracle("0.15.0", [*base, "--speculative-config", spec20], env, inst)[0]
    )
    legacy = [*base, "--enable-chunked-prefill", "--speculative-model", "D", "--num-speculative-tokens", "5"]
    assert any("chunked prefill" in p for p in oracle("0.6.3", legacy, env, inst)[0])
    dtp = [*base, "--speculative-model", "D", "--speculative-draft-tensor-parallel-size", "2"]
    assert any("must be 1" in p for p in oracle("0.6.3", dtp, env, inst)[0])
    ngram = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    cpu = {"tensor_parallel_size": 1, "device": "cpu"}
    assert any(
        "CPU backend" in p for p in oracle("0.15.0", [*base, "--speculative-config", ngram], {}, cpu)[0]
    )
    assert not oracle("0.32.0", [*base, "--speculative-config", ngram], {}, cpu)[0]
    assert any("legacy AWQ" in p for p in oracle("0.20.0", [*base, "--quantization", "awq"], env, inst)[0])
    assert any("does not exist" in p for p in oracle("0.15.0", [*base, "--numa-bind"], env, inst)[0])


def test_instances_spanning_numa_nodes_bind_each_rank(host_of, empty_root) -> None:
    # one TP8 server over both sockets (the operator's strategy: the profile's gives way to 4 x TP2)
    sets = ["layout.strategy=tensor_parallel"]
    for version, _inst, r in _render_everything(host_of, empty_root, "h100-sxm-8x", None, sets):
        if version in ("0.20.0", "0.33.0"):
            a = r.argv
            i = a.index("--numa-bind-nodes")
            assert a[i + 1 : i + 9] == ["0", "0", "0", "0", "1", "1", "1", "1"], a
        if version == "0.15.0":
            assert "--numa-bind-nodes" not in r.argv and r.argv[0] == "vllm"
            assert any("not bound" in w for w in r.warnings)


def test_cpu_plans_do_not_speculate_where_the_cpu_backend_refuses(host_of, empty_root) -> None:
    seen = {}
    for version, _inst, r in _render_everything(
        host_of, empty_root, "no-driver", "Qwen/Qwen3-0.6B", ["speculative.method=ngram"]
    ):
        seen[version] = "--speculative-config" in r.argv or "--speculative-model" in r.argv
        if not seen[version]:
            assert any("CPU backend" in w for w in r.warnings), (version, r.warnings)
        assert "VLLM_CPU_OMP_THREADS_BIND" not in r.env  # vLLM's own binding reserves its cores
    assert not any(seen[v] for v in ("0.6.3", "0.10.0", "0.15.0", "0.18.0"))
    assert all(seen[v] for v in ("0.20.0", "0.25.0", "0.32.0", "0.33.0"))


def test_offline_target_never_gets_a_hub_only_draft(host_of, empty_root, tmp_path) -> None:
    """A target served from disk (HF_HUB_OFFLINE=1) with a draft only the catalog knows: vLLM would
    fail to fetch the draft at start, so the plan itself proposes from the prompt instead and says how to
    get the draft (what plan shows is what runs: render no longer switches behind its back)."""
    target = tmp_path / "Qwen3-8B-local"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "max_position_embeddings": 40960,
                "torch_dtype": "bfloat16",
            }
        )
    )
    host = host_of("rtx4090-1x")
    typed = make_plan(
        host, empty_root, model=str(target), sets=["speculative.draft=Qwen/Qwen3-0.6B"], environ={}
    )
    assert typed.draft is None and all(
        i.speculative.method == "ngram" for i in typed.instances if i.speculative
    )
    assert any("hf download Qwen/Qwen3-0.6B" in w for w in typed.warnings), typed.warnings
    rendered = list(
        _render_everything(
            host_of, empty_root, "rtx4090-1x", str(target), ["speculative.draft=Qwen/Qwen3-0.6B"]
        )
    )
    assert rendered
    for version, _inst, r in rendered:
        assert r.env.get("HF_HUB_OFFLINE") == "1"
        assert "Qwen/Qwen3-0.6B" not in " ".join(r.argv), version
        assert not any("download" in w for w in r.warnings), version  # nothing left for render to switch
    with pytest.raises(PlanRefused, match=r"hf download Qwen/Qwen3-0\.6B"):
        make_plan(
            host,
            empty_root,
            model=str(target),
            environ={},
            sets=["speculative.draft=Qwen/Qwen3-0.6B", "speculative.method=draft_model"],
        )


@pytest.mark.parametrize("installed", ["0.33.0", "0.22.0"])
def test_a_draft_with_another_vocabulary(host_of, empty_root, installed) -> None:
    """Qwen2.5-32B (vocab 152064) with Llama-3.2-1B (128256) as the draft: vLLM 0.25+ runs the pair
    with use_heterogeneous_vocab; older releases refuse it, and render says so and proposes from the
    prompt instead."""
    host = host_of("a800-pcie-4x-2numa")
    host = host._replace(
        software=host.software._replace(vllm_version=installed, numactl_path="/usr/bin/numactl")
    )
    typed = make_plan(
        host,
        empty_root,
        model="Qwen/Qwen2.5-32B-Instruct",
        draft="meta-llama/Llama-3.2-1B-Instruct",
        sets=["server.vllm_command=vllm"],
        environ={},
    )
    plan = typed.to_json()
    inst = plan["instances"][0]
    assert plan["model"]["vocab_size"] != plan["draft"]["vocab_size"] if plan["draft"] else True
    for version in known_versions():
        r = render_instance(typed, typed.instances[0], release(version), "vllm", "/usr/bin/numactl")
        assert not oracle(version, r.argv, r.env, inst)[0]
        a = r.argv
        spec = json.loads(a[a.index("--speculative-config") + 1]) if "--speculative-config" in a else None
        if installed == "0.22.0":  # the planner knew the installed vLLM refuses the pair
            assert inst["speculative"]["method"] == "ngram"
            continue
        assert inst["speculative"]["method"] == "draft_model"
        if version in ("0.25.0", "0.29.0", "0.32.0", "0.33.0"):
            assert spec["method"] == "draft_model" and spec["use_heterogeneous_vocab"] is True, version
        elif spec is not None:
            assert spec["method"] == "ngram" and "use_heterogeneous_vocab" not in spec, version
            if version in ("0.15.0", "0.20.0", "0.22.0"):
                assert any("another vocabulary" in w for w in r.warnings), (version, r.warnings)


def test_gpus_named_by_uuid_where_vllm_maps_them(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    uuids = {g.index: g.uuid for g in host.gpus}
    rendered = {v: r for v, inst, r in _render_everything(host_of, empty_root, "a800-pcie-4x-2numa", None)}
    assert all(u and u.startswith("GPU-") for u in uuids.values())
    assert rendered["0.33.0"].env["CUDA_VISIBLE_DEVICES"] in {
        f"{uuids[0]},{uuids[1]}",
        f"{uuids[2]},{uuids[3]}",
    }
    assert rendered["0.29.0"].env["CUDA_VISIBLE_DEVICES"] in {"0,1", "2,3"}


def test_an_operators_openmp_binding_is_rendered_one_list_per_rank(host_of, empty_root) -> None:
    """``cpu.omp_threads_bind`` reaches vLLM (VLLM_CPU_OMP_THREADS_BIND) as the plan shows it: one CPU
    list per rank; each of two servers its own list, one data-parallel server both joined by |."""
    model = "Qwen/Qwen3-0.6B"
    for version, inst, r in _render_everything(
        host_of, empty_root, "no-driver", model, ["cpu.omp_threads_bind=1"]
    ):
        assert inst["omp_threads_bind"] == "1" and r.env["VLLM_CPU_OMP_THREADS_BIND"] == "1", version
    host = host_of("no-driver")._replace(memory_bytes=64 << 30)
    two = ["cpu.omp_threads_bind=0|1", "layout.replicas=2", "cpu.kv_cache_space_gib=1"]
    apart = make_plan(host, empty_root, model=model, sets=[*two, "layout.shape=servers"], environ={})
    assert [i.omp_threads_bind for i in apart.instances] == ["0", "1"]
    one = make_plan(host, empty_root, model=model, sets=[*two, "layout.shape=data_parallel"], environ={})
    assert [i.omp_threads_bind for i in one.instances] == ["0|1"]
    rendered = render_instance(one, one.instances[0], release("0.32.0"), "vllm", None)
    assert rendered.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    # the plan's contract: the field in its schema, and back from its JSON as it was

    doc = one.to_json()
    jsonschema.validate(doc, json.loads((ROOT / "schemas" / "hwprofile.plan-1.schema.json").read_text()))
    assert InstancePlan.from_json(doc["instances"][0]) == one.instances[0]
    nobind = make_plan(
        host, empty_root, model=model, sets=[*two[1:], "cpu.omp_threads_bind=nobind"], environ={}
    )
    assert {i.omp_threads_bind for i in nobind.instances} == {"nobind"}
    with pytest.raises(PlanRefused, match="names 2 CPU lists; the plan runs 1 CPU rank") as e:
        make_plan(host, empty_root, model=model, sets=["cpu.omp_threads_bind=0|1"], environ={})
    assert "cpu.omp_threads_bind=0" in "\n".join(e.value.report())
    with pytest.raises(ConfigError, match=r"cpu\.omp_threads_bind.*auto, nobind, or a CPU list per rank"):
        make_plan(host, empty_root, model=model, sets=["cpu.omp_threads_bind=0-3;1"], environ={})
