"""vLLM picks the speculative method from a model's path (``"dflash" in path`` → DFlash): the planner
refuses a plan whose target or draft path would make vLLM run another method than planned, and says
which path and how to fix it; a symlink with a neutral name plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwprofile.pipeline import make_plan
from hwprofile.plan import PlanRefused
from hwprofile.plan.specpath import PATH_METHODS, method_from_path

TINY = {
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


def model_dir(parent: Path, name: str, **extra: object) -> Path:
    d = parent / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, **extra}))
    return d


def test_the_substrings_and_their_order_are_vllms() -> None:
    """vLLM 0.33 tests ``eagle-``, ``eagle3``, ``dflash``, ``dspark`` on the lower-cased path, in
    this order (the first wins); a path with none says nothing."""
    assert [s for s, _ in PATH_METHODS] == ["eagle-", "eagle3", "dflash", "dspark"]
    assert method_from_path("/srv/models/z-lab/Qwen3-8B-DFlash-b16") == ("dflash", "dflash")
    assert method_from_path("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == ("eagle3", "eagle3")
    assert method_from_path("yuhuili/EAGLE-LLaMA3-Instruct-8B") == ("eagle-", "eagle")
    assert method_from_path("/m/eagle-dflash") == ("eagle-", "eagle")  # the first in vLLM's order wins
    assert method_from_path("/m/deepseek-ai/dspark_qwen3_8b") == ("dspark", "dspark")
    assert method_from_path("/srv/models/Qwen3.8-27B") is None
    assert method_from_path("/m/eagle") is None  # "eagle" alone is none of them: vLLM keeps the method
    # a release without the method cannot pick it (hwprofile's flag table: dflash from 0.20, dspark from 0.25)
    assert method_from_path("/m/qwen-dflash", "0.18.0") is None
    assert method_from_path("/m/qwen-dflash", "0.20.0") == ("dflash", "dflash")
    assert method_from_path("/m/dspark-x", "0.22.0") is None and method_from_path("/m/dspark-x", "0.33.0+cpu")
    assert method_from_path("/m/EAGLE-x", "0.6.3") == ("eagle-", "eagle")
    assert method_from_path("/m/qwen-dflash", None) == ("dflash", "dflash")  # an unknown release: every one


def test_mtp_on_a_target_whose_path_names_dflash_is_refused(host_of, empty_root, tmp_path: Path) -> None:
    """MTP: vLLM takes the target's own path as the draft's, and detects DFlash in it."""
    target = model_dir(tmp_path, "Qwen-dflash-test", num_nextn_predict_layers=1)
    with pytest.raises(PlanRefused) as e:
        make_plan(
            host_of("rtx4090-1x"), empty_root, environ={}, model=str(target), sets=["speculative.method=mtp"]
        )
    msg = str(e.value)
    assert (
        str(target) in msg
        and "'dflash'" in msg
        and "vLLM would run dflash" in msg
        and "mtp is planned" in msg
    )
    assert "symlink" in msg and any("rename" in s for s in e.value.suggestions)
    # the same directory through a symlink with a neutral name: planned, and the check is in the reasons
    link = tmp_path / "qwen-mtp"
    link.symlink_to(target)
    p = make_plan(
        host_of("rtx4090-1x"), empty_root, environ={}, model=str(link), sets=["speculative.method=mtp"]
    ).to_json()
    (inst,) = p["instances"]
    assert inst["speculative"]["method"] == "mtp"
    checked = [
        r
        for r in p["reasons"]
        if r["key"] == "instances[0].speculative.method" and "none of the substrings" in r["reason"]
    ]
    assert checked and str(link) in checked[0]["reason"]


def test_a_draft_whose_path_names_eagle_is_refused(host_of, empty_root, tmp_path: Path) -> None:
    """draft_model: the draft's path is the one vLLM looks at; the target's is not."""
    target = model_dir(tmp_path, "target-eagle3-named", num_hidden_layers=24)
    draft = model_dir(tmp_path, "EAGLE-draft")
    with pytest.raises(PlanRefused) as e:
        make_plan(
            host_of("a100-80g-pcie-1x"),
            empty_root,
            environ={},
            model=str(target),
            draft=str(draft),
            sets=["speculative.method=draft_model"],
        )
    assert (
        str(draft) in str(e.value)
        and "the draft model's path" in str(e.value)
        and "vLLM would run eagle" in str(e.value)
    )
    neutral = tmp_path / "small-draft"
    neutral.symlink_to(draft)
    p = make_plan(
        host_of("a100-80g-pcie-1x"),
        empty_root,
        environ={},
        model=str(target),
        draft=str(neutral),
        sets=["speculative.method=draft_model"],
    ).to_json()
    assert p["instances"][0]["speculative"]["method"] == "draft_model"


def test_ngram_builds_no_draft_config_so_the_path_does_not_matter(
    host_of, empty_root, tmp_path: Path
) -> None:
    target = model_dir(tmp_path, "tiny-dflash")
    p = make_plan(
        host_of("rtx4090-1x"), empty_root, environ={}, model=str(target), sets=["speculative.method=ngram"]
    ).to_json()
    assert p["instances"][0]["speculative"]["method"] == "ngram"
    assert not [r for r in p["reasons"] if "none of the substrings" in r["reason"]]
