"""Plans of a hybrid model (recurrent-state layers beside attention): the seeds' Qwen3.8-27B from
its config-only copy (tests/fixtures/models/qwen3.8-27b) on an A100 80G, and a tiny Qwen3-Next on
the CPU. KV per token counts the attention layers only, the state per sequence is in the memory
breakdown and its reasons, ``max_num_seqs`` never exceeds the sequences whose state the pool holds,
the logged KV figure is vLLM's hybrid arithmetic, and releases before the architecture are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from vllmtools import TINY_NEXT

from hwprofile.plan import PlanRefused
from hwprofile.plan.memory import hybrid_kv_cache

QWEN38 = Path(__file__).parent / "fixtures" / "models" / "qwen3.8-27b"


def qwen38_dir(tmp_path: Path) -> Path:
    d = tmp_path / "Qwen3.8-27B"
    shutil.copytree(QWEN38, d)
    return d


def test_qwen38_on_an_a100_counts_attention_layers_and_caps_sequences(host_of, empty_root, tmp_path) -> None:
    from hwprofile.pipeline import make_plan

    sets = [
        "speculative.method=none",
        "engine.max_num_seqs=1024",
        "engine.max_model_len=32768",
        "engine.mamba_ssm_cache_dtype=float32",
    ]
    p = make_plan(
        host_of("a100-80g-pcie-1x"), empty_root, environ={}, model=str(qwen38_dir(tmp_path)), sets=sets
    )
    inst = p.instances[0]
    mem = inst.memory
    assert mem.kv_bytes_per_token_target == 65_536  # 16 full-attention layers, bf16
    assert mem.block_size == 784  # aligned to the fp32 GDN state page
    # 48 GDN layers x 3,211,264 B padded pages, 1 slot each (prefix caching off by default?)
    slots = 2 if inst.engine.enable_prefix_caching else 1
    assert mem.state_bytes_per_sequence == 48 * 3_211_264 * slots
    assert inst.engine.max_num_seqs <= mem.state_sequences < 1024
    why = {r.key: r.reason for r in p.reasons}
    assert "state" in why["instances[0].engine.max_num_seqs"]
    assert "MiB per GPU" in why["instances[0].memory.state_bytes_per_sequence"]
    assert any("max_num_seqs 1024 lowered" in w for w in p.warnings)
    from hwprofile.cli.views import format_plan

    text = format_plan(p, explain=True)
    print(text)
    assert "recurrent state" in text and "per running sequence" in text
    from hwprofile.model import read_model_dir

    m = read_model_dir(qwen38_dir(tmp_path / "again"))
    h = hybrid_kv_cache(m, mem.kv_cache_bytes, inst.engine.max_model_len, prefix_caching=slots == 2)
    assert mem.vllm_logged_kv_tokens == h.logged_tokens


@pytest.mark.parametrize("version", ["0.16.0", "0.12.1"])
def test_releases_before_qwen3_5_are_refused_naming_the_first(host_of, empty_root, tmp_path, version) -> None:
    from hwprofile.pipeline import make_plan

    host = host_of("a100-80g-pcie-1x")
    host = host._replace(software=host.software._replace(vllm_version=version))
    with pytest.raises(PlanRefused, match=r"0\.17\.0"):
        make_plan(
            host, empty_root, environ={}, model=str(qwen38_dir(tmp_path)), sets=["speculative.method=none"]
        )


def test_tiny_qwen3_next_cpu_plan_says_what_vllm_logs(host_of, empty_root, tmp_path) -> None:
    """On an AVX512-BF16 CPU vLLM keeps the state in float32 (block 256 for this model), elsewhere
    in the model's bfloat16 (block 128): the plan's figure follows (the slow test checks vLLM)."""
    from hwprofile.pipeline import make_plan

    model = tmp_path / "next"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_NEXT))
    host = host_of("no-driver")
    got = {}
    for name, flags in (("bf16", ("fpu", "avx2", "avx512f", "avx512_bf16")), ("plain", ("fpu", "avx2"))):
        h = host._replace(cpu=host.cpu._replace(flags=flags))
        sets = [
            "speculative.method=none",
            "engine.max_model_len=1024",
            "cpu.kv_cache_space_gib=0.0625",
            "engine.enable_prefix_caching=false",
        ]
        p = make_plan(h, empty_root, environ={}, model=str(model), sets=sets)
        mem = p.instances[0].memory
        got[name] = (mem.block_size, mem.vllm_logged_kv_tokens, mem.kv_bytes_per_token_target)
    assert got["bf16"] == (256, 37_449, 2 * 2 * 2 * 64 * 2)
    assert got["plain"] == (128, 47_662, 2 * 2 * 2 * 64 * 2)


def _qwen38_plan(host_of, empty_root, tmp_path: Path, sets: list[str], version: str | None = None) -> Any:
    from hwprofile.pipeline import make_plan

    host = host_of("a100-80g-pcie-1x")
    if version:
        host = host._replace(software=host.software._replace(vllm_version=version))
    d = qwen38_dir(tmp_path / "-".join([*sets, version or ""]).replace("=", "_").replace(".", "_"))
    return make_plan(host, empty_root, environ={}, model=str(d), sets=["engine.max_model_len=8192", *sets])


def _argv(plan: Any, version: str) -> list[str]:
    from hwprofile.render.translate import render_instance
    from hwprofile.render.versions import release

    return render_instance(plan, plan.instances[0], release(version), "vllm", None).argv


def _env(plan: Any, version: str) -> dict[str, str]:
    from hwprofile.render.translate import render_instance
    from hwprofile.render.versions import release

    return render_instance(plan, plan.instances[0], release(version), "vllm", None).env


def test_weights_as_vllm_loads_them_vision_and_mtp(host_of, empty_root, tmp_path) -> None:
    """No MTP speculation: neither the vision tower (--language-model-only) nor the MTP layer is
    loaded; with MTP the layer is; with engine.language_model_only=off the tower is, and no flag."""
    from hwprofile.model import read_model_dir

    facts = read_model_dir(qwen38_dir(tmp_path / "facts"))
    assert facts.vision_bytes > 0.8 * 2**30 and facts.mtp_bytes > 0.4 * 2**30
    plain = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=none"])
    assert plain.model.weights_bytes == facts.weights_bytes - facts.vision_bytes - facts.mtp_bytes
    assert plain.instances[0].memory.weights_bytes == plain.model.weights_bytes
    assert plain.instances[0].engine.language_model_only is True
    why = {r.key: r.reason for r in plain.reasons}["model.weights_bytes"]
    assert "vision tower" in why and "not loaded" in why and "mtp." in why
    assert "--language-model-only" in _argv(plain, "0.33.0")

    mtp = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=mtp"])
    assert mtp.model.weights_bytes == facts.weights_bytes - facts.vision_bytes
    why = {r.key: r.reason for r in mtp.reasons}["model.weights_bytes"]
    assert "MTP speculation runs" in why and "shared" in why  # the head: 0.17+ frees its own copy

    sets = ["speculative.method=none", "engine.language_model_only=off"]
    full = _qwen38_plan(host_of, empty_root, tmp_path, sets)
    assert full.model.weights_bytes == facts.weights_bytes - facts.mtp_bytes
    assert full.instances[0].engine.language_model_only is False
    assert "--language-model-only" not in _argv(full, "0.33.0")


def test_language_model_only_needs_0_18_and_old_mtp_heads_are_counted(host_of, empty_root, tmp_path) -> None:
    """vLLM 0.17 serves the architecture but has no --language-model-only: the tower is counted; the
    MTP drafter's own bf16 embedding and LM head (vllm#53887) are counted only before 0.17."""
    from hwprofile.model import read_model_dir

    facts = read_model_dir(qwen38_dir(tmp_path / "facts"))
    old = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=none"], "0.17.0")
    assert old.model.weights_bytes == facts.weights_bytes - facts.mtp_bytes
    assert old.instances[0].engine.language_model_only is False
    # 0.17 on frees the drafter's own head after load (read in 0.17, 0.18, 0.32): the pool pays nothing
    before = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=mtp"], "0.18.0")
    assert before.model.weights_bytes == facts.weights_bytes - facts.vision_bytes
    assert "load's peak" in {r.key: r.reason for r in before.reasons}["model.weights_bytes"]
    assert "--language-model-only" in _argv(before, "0.18.0")
    from hwprofile.plan.loaded import mtp_head_bytes

    head = 2 * facts.vocab_size * facts.hidden_size * 2
    assert mtp_head_bytes(facts, "mtp", "0.16.0") == head and mtp_head_bytes(facts, "mtp", "0.17.0") == 0


def test_a_plain_transformer_has_no_language_model_only(host_of, empty_root) -> None:
    from hwprofile.pipeline import make_plan

    p = make_plan(
        host_of("a100-80g-pcie-1x"),
        empty_root,
        environ={},
        model="Qwen/Qwen2.5-7B-Instruct",
        sets=["speculative.method=none"],
    )
    assert "language_model_only" not in json.dumps(p.instances[0].engine.to_json())
    assert not any(r.key == "model.weights_bytes" for r in p.reasons)


def test_float16_state_where_it_keeps_more_sequences_resident(host_of, empty_root, tmp_path) -> None:
    """auto: float16 SSM state where the model's float32 holds fewer sequences than max_num_seqs asks
    and float16 more (rendered as --mamba-ssm-cache-dtype float16); the model's own where enough fit;
    --mamba-cache-mode as the plan assumes (align with prefix caching, else none; 0.15+)."""
    many = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=none", "engine.max_num_seqs=256"])
    wide = _qwen38_plan(
        host_of,
        empty_root,
        tmp_path,
        ["speculative.method=none", "engine.max_num_seqs=256", "engine.mamba_ssm_cache_dtype=float32"],
    )
    assert many.instances[0].engine.mamba_ssm_cache_dtype == "float16"
    assert many.instances[0].memory.state_sequences > wide.instances[0].memory.state_sequences
    assert (
        many.instances[0].memory.state_bytes_per_sequence < wide.instances[0].memory.state_bytes_per_sequence
    )
    why = {r.key: r.reason for r in many.reasons}["instances[0].engine.mamba_ssm_cache_dtype"]
    assert "float16" in why and "64 instead of 37" in why
    argv = _argv(many, "0.33.0")
    assert argv[argv.index("--mamba-ssm-cache-dtype") + 1] == "float16"
    assert _env(many, "0.33.0")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    mode = "align" if many.instances[0].engine.enable_prefix_caching else "none"
    assert argv[argv.index("--mamba-cache-mode") + 1] == mode == many.instances[0].engine.mamba_cache_mode

    few = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=none", "engine.max_num_seqs=4"])
    assert few.instances[0].engine.mamba_ssm_cache_dtype == "auto"
    assert "--mamba-ssm-cache-dtype" not in _argv(few, "0.33.0")

    nocache = _qwen38_plan(
        host_of,
        empty_root,
        tmp_path,
        ["speculative.method=none", "engine.max_num_seqs=4", "engine.enable_prefix_caching=false"],
    )
    assert nocache.instances[0].engine.mamba_cache_mode == "none"
    assert "--mamba-cache-mode" not in _argv(nocache, "0.14.0")  # the flag is 0.15+


INT4 = Path(__file__).resolve().parent.parent / "examples" / "models" / "qwen3.8-27b-int4"


@pytest.mark.parametrize(
    ("family", "want"),
    [("Qwen3.8-27B-INT4", "fp8"), ("Qwen3.6-27B-INT4", "auto"), ("Hybrid-27B-INT4", "auto")],
)
def test_fp8_kv_only_where_verified_for_the_family(host_of, empty_root, tmp_path, family, want) -> None:
    """An RTX 4090 has FP8 hardware (its profile asks fp8_if_supported): the Qwen3.8 int4 copy gets
    fp8 KV (verified), the same config named Qwen3.6 does not (vllm#26646), an unknown hybrid neither."""
    from hwprofile.pipeline import make_plan

    d = tmp_path / family
    shutil.copytree(INT4, d)
    p = make_plan(
        host_of("rtx4090-1x"), empty_root, environ={}, model=str(d), sets=["speculative.method=none"]
    )
    inst = p.instances[0]
    assert inst.engine.kv_cache_dtype == want
    why = {r.key: r.reason for r in p.reasons}["instances[0].engine.kv_cache_dtype"]
    assert {"Qwen3.8-27B-INT4": "verified", "Qwen3.6-27B-INT4": "26646", "Hybrid-27B-INT4": "not verified"}[
        family
    ] in why


def test_speculation_by_load_and_its_state_cost(host_of, empty_root, tmp_path) -> None:
    """speculative.method auto on a hybrid: MTP at one request in flight, with prefix caching off
    (vllm#43559) and its state cost said; off above ~8 in flight, where more sequences stay resident."""
    single = _qwen38_plan(host_of, empty_root, tmp_path, ["layout.workload_concurrency=1"])
    inst = single.instances[0]
    assert inst.speculative is not None and inst.speculative.method == "mtp"
    assert inst.engine.enable_prefix_caching is False and inst.engine.mamba_cache_mode == "none"
    why = {r.key: (r.value, r.reason) for r in single.reasons}
    assert "vllm#43559" in why["instances[0].engine.enable_prefix_caching"][1]
    with_spec, text = why["instances[0].speculative.state_cost"]
    assert with_spec == inst.memory.state_sequences and "instead of" in text
    loaded = _qwen38_plan(host_of, empty_root, tmp_path, ["layout.workload_concurrency=16"])
    busy = loaded.instances[0]
    assert busy.speculative is None
    assert busy.memory.state_sequences > inst.memory.state_sequences
    assert any(
        r.key == "speculative.method" and r.value is None and "16 requests" in r.reason
        for r in loaded.reasons
    )
    pays = why["instances[0].speculative.predicted"]
    assert pays[0] is (inst.prediction.tpot_ms < float(pays[1].split("ms without")[0].split(", ")[-1]))
    assert "predicted with it" in pays[1]
    # asked for outright: kept at any load
    asked = _qwen38_plan(
        host_of, empty_root, tmp_path, ["layout.workload_concurrency=16", "speculative.method=mtp"]
    )
    assert asked.instances[0].speculative is not None


def test_a_12gb_card_refuses_the_seeds_model_saying_what_fits(host_of, empty_root) -> None:
    """Neither the 16-bit nor the int4 checkpoint fits 12 GB: refused, naming models that do."""
    from hwprofile.pipeline import make_plan

    with pytest.raises(PlanRefused) as e:
        make_plan(host_of("rtx3060-12g-1x"), empty_root, environ={}, model="Qwen/Qwen3.8-27B")
    assert "Qwen3.8-27B-INT4" in e.value.message
    fits = [s for s in e.value.suggestions if "other families" in s]
    assert fits and "GiB" in fits[0]


def test_hybrid_predictions_state_bandwidth_and_mtp_draft_cost() -> None:
    """Each decode step reads and writes every running sequence's recurrent state (a term that grows
    with the batch); the context's attention FLOPs count the attention layers only; a request's own
    prompt is in its TTFT, not its TPOT; an MTP draft pays its layer and the LM head per proposal."""
    from hwprofile.model import read_model_dir
    from hwprofile.plan import predict as pm
    from hwprofile.plan.candidates import model_shape, mtp_draft_shape

    m = read_model_dir(INT4)
    shape = model_shape(m, 2)
    assert shape.attn_layers == 16 and m.stack.state_layers == 48
    assert 140 * 2**20 < shape.state_bytes < 150 * 2**20  # 146.8 MiB at the config's float32 SSM state
    assert model_shape(m, 2, "float16").state_bytes < 0.55 * shape.state_bytes
    gpu = pm.Gpu("RTX 3090", 936.0, 71.2, 24 * 2**30, "test")
    link = pm.Link("none", 0.0, 0.0, "one GPU")
    one = pm.step_ms(gpu, shape, 1, link, 1, 4096)
    eight = pm.step_ms(gpu, shape, 1, link, 8, 4096)
    assert eight["state_ms"] == pytest.approx(8 * one["state_ms"]) and one["state_ms"] > 0.3
    draft = mtp_draft_shape(m, 2)
    assert draft is not None and draft.weights_bytes > m.vocab_size * m.hidden_size * 2
    cand = pm.Candidate(1, 1, 1, 1, 2048, True, 100_000, link)
    wl = pm.Workload(8192, 128, 1)
    plain = pm.predict(gpu, shape, cand, wl, None)
    one_step = pm.step_ms(gpu, shape, 1, link, 1, 8192 + 64)["total_ms"]
    assert plain.tpot_ms == pytest.approx(one_step) and one_step < plain.ttft_ms
    spec = pm.Speculation("mtp", (), 2, 0.6, draft, "test")
    with_mtp = pm.predict(gpu, shape, cand, wl, spec)
    term = next(t for t in with_mtp.terms if t["term"].startswith("speculation"))
    assert "draft 0.00 ms" not in term["source"]


@pytest.mark.parametrize("version", ["0.18.0", "0.25.0", "0.33.0"])
def test_mtp_is_named_mtp_on_every_release_serving_qwen3_5(host_of, empty_root, tmp_path, version) -> None:
    """qwen3_5_mtp is a deprecated alias of mtp from 0.17 on (vllm/config/speculative.py): `mtp`."""
    from hwprofile.plan.releases import MTP_METHOD_NAME

    p = _qwen38_plan(host_of, empty_root, tmp_path, ["speculative.method=mtp"], version)
    argv = _argv(p, version)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == MTP_METHOD_NAME == "mtp"
    assert "--enable-prefix-caching" not in argv  # beside MTP on a hybrid (vllm#43559)


@pytest.mark.parametrize("copy", ["qwen3.8-27b", "qwen3.8-27b-fp8"])
def test_a_local_copy_too_big_names_its_catalog_twins_int4_as_loaded(
    host_of, empty_root, tmp_path, copy
) -> None:
    """A local BF16 or FP8 directory of the seeds' model (not in the catalog by name) that does not fit a
    3090 is refused naming the catalog's int4 checkpoint of the same architecture, sized as the plan
    would load it (no vision tower, no MTP layers): the int4 plan's own weights; on 12 GB it says that
    it does not fit there either."""
    from hwprofile.pipeline import make_plan

    d = tmp_path / copy
    shutil.copytree(Path(__file__).parents[1] / "examples" / "models" / copy, d)
    int4 = make_plan(host_of("rtx3090-1x"), empty_root, environ={}, model=str(INT4))
    want = f"~{int4.instances[0].memory.weights_bytes / 2**30:.1f} GiB"
    for host, either in (("rtx3090-1x", False), ("rtx3060-12g-1x", True)):
        with pytest.raises(PlanRefused) as e:
            make_plan(host_of(host), empty_root, environ={}, model=str(d))
        four = [s for s in e.value.suggestions if s.startswith("a 4-bit checkpoint")]
        assert (
            four
            and "(RedHatAI/Qwen3.8-27B-INT4)" in four[0]
            and "--model RedHatAI/Qwen3.8-27B-INT4" in four[0]
        )
        assert want in four[0], (want, four[0])
        assert ("not enough here either" in four[0]) is either


def test_speculation_on_a_hybrid_keeps_utilization_headroom(host_of, empty_root) -> None:
    """A hybrid that speculates: a shipped utilization above 0.93 is lowered to 0.93 with the reason
    (the decode workspace outgrows vLLM's profiling run); the user's own value is kept, with a
    warning; no speculation or no hybrid: untouched."""
    from hwprofile.config import Source
    from hwprofile.config.settings import Settings
    from hwprofile.model import read_model_dir
    from hwprofile.pipeline import make_plan
    from hwprofile.plan.context import PlanContext
    from hwprofile.plan.hybridspec import speculation_headroom
    from hwprofile.plan.reasons import Reasons

    hybrid = read_model_dir(INT4)
    setting = ("engine", "gpu_memory_utilization")
    snap = host_of("rtx3090-1x")
    for kind, want in (("builtin", 0.93), ("default", 0.93), ("cli", 0.97), ("overrides", 0.97)):
        ctx = PlanContext(snap, Settings(), Reasons({setting: Source(kind)}))
        got = speculation_headroom(ctx, hybrid, 0.97, "mtp", "instances[0]", "vllm-gpu0")
        assert got == want, kind
        assert bool(ctx.warnings) is (want == 0.97)
        items = ctx.reasons.items
        assert bool(items) is (want == 0.93) and (not items or "profiling" in items[0].reason)
    ctx = PlanContext(snap, Settings(), Reasons({setting: Source("builtin")}))
    assert speculation_headroom(ctx, hybrid, 0.97, None, "k", "n") == 0.97
    assert speculation_headroom(ctx, hybrid, 0.9, "ngram", "k", "n") == 0.9 and not ctx.reasons.items
    assert not ctx.warnings
    sets = ["speculative.method=mtp", "engine.gpu_memory_utilization=0.97"]
    p = make_plan(host_of("rtx3090-1x"), empty_root, environ={}, model="Qwen/Qwen3.8-27B", sets=sets)
    assert p.instances[0].engine.gpu_memory_utilization == 0.97
    assert any("leaves no headroom" in w for w in p.warnings)


INT4 = Path(__file__).parent.parent / "examples" / "models" / "qwen3.8-27b-int4"


@pytest.mark.parametrize("host", ["rtx3090-1x", "rtx3090-2x", "rtx4090-1x", "a100-80g-pcie-1x"])
@pytest.mark.parametrize("clients", [16, 64, 256])
def test_the_batching_is_chosen_among_the_sequences_whose_state_fits(
    host_of, empty_root, host, clients
) -> None:
    """A hybrid's batching rows are predicted as the instance would run them: ``max_num_seqs`` at most
    the sequences whose recurrent state the pool holds at that batching (what the instance would lower
    it to), so the row the objective takes is the one that runs, and its reason quotes its figures (on
    one RTX 3090 at 64 clients it quoted 64 sequences, TTFT 637 ms, while 26 ran at TTFT 30 s)."""
    from hwprofile.pipeline import make_plan

    sets = [f"layout.workload_concurrency={clients}"]
    p = make_plan(host_of(host), empty_root, environ={}, model=str(INT4), sets=sets)
    doc = p.to_json()
    assert doc["prediction"]["groups"]
    for grp in doc["prediction"]["groups"]:
        (inst,) = [i for i in p.instances if set(i.gpus) <= set(grp["gpus"])][:1]
        rows = grp["batching"]
        (chosen,) = [r for r in rows if r["chosen"]]
        assert chosen["max_num_seqs"] <= inst.memory.state_sequences, (chosen, inst.memory.state_sequences)
        assert inst.engine.max_num_seqs == chosen["max_num_seqs"], (inst.engine.max_num_seqs, chosen)
        assert len({(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in rows}) == len(rows)
        if "asked_max_num_seqs" in chosen and grp["batching_chosen_by"] == "prediction":
            assert f"of {chosen['asked_max_num_seqs']} tried" in grp["batching_reason"]
    assert not any("the recurrent state of more does not fit" in w for w in p.warnings), p.warnings
    if host == "rtx3090-1x" and clients == 64:  # the case that was wrong: what runs is what was judged
        (grp,) = doc["prediction"]["groups"]
        assert any(r.get("asked_max_num_seqs") == 64 for r in grp["batching"])
        assert p.instances[0].engine.max_num_seqs < 64


def test_a_layout_candidate_is_predicted_at_the_sequences_whose_state_fits(
    host_of, empty_root, tmp_path
) -> None:
    """8 x H100 with the bf16 Qwen3.8-27B: at TP1 each instance holds 83 sequences' state, not the
    profile's 256, so the 8 x TP1 candidate sustains at most 8 x 83 requests (it was judged at 2,048,
    and won the layout on that)."""
    from hwprofile.pipeline import make_plan

    host = host_of("h100-sxm-8x")
    model = str(qwen38_dir(tmp_path))
    tp1 = make_plan(
        host,
        empty_root,
        environ={},
        model=model,
        sets=["layout.tensor_parallel_size=1", "layout.batching=configured"],
    )
    per_instance = tp1.instances[0].memory.state_sequences
    assert per_instance < 256  # the profile's max_num_seqs
    doc = make_plan(host, empty_root, environ={}, model=model).to_json()
    (grp,) = doc["prediction"]["groups"]
    one = next(c for c in grp["candidates"] if c["tensor_parallel_size"] == 1)
    assert 0 < one["capacity_concurrency"] <= one["instances"] * per_instance, (one, per_instance)
