"""A draft is compatible with its target beyond ``vocab_size``: the two tokenizers (built here with
the ``tokenizers`` library, offline) are compared id by id, special by special and on the shipped
probe texts; a draft whose ids mean other tokens is refused for ``speculative.method=draft_model``
before vLLM 0.25 (with the numbers), mapped with ``use_heterogeneous_vocab`` from 0.25 on; the same
id map with other special tokens is planned with a warning (the ids the two exchange mean the same
text, so proposals stay valid; only the acceptance around those tokens suffers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hwprofile.model.tokenizer_check import (
    TokenizerCheck,
    check_facts,
    compare,
    probe_texts,
    read_tokenizer,
    tokenizer_of,
)
from hwprofile.pipeline import make_plan
from hwprofile.plan.refusal import PlanRefused
from hwprofile.render.translate import render_instance
from hwprofile.render.versions import release

pytest.importorskip("tokenizers")

WORDS = ["the", "quick", "brown", "fox", "def", "return", "a", "b", "=", "(", ")", ":", "啊", "阿"]
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_end|>"]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def make_model(
    out: Path,
    words: list[str] = WORDS,
    special: list[str] = SPECIALS,
    eos: str = "</s>",
    config: dict | None = None,
) -> Path:
    """A model directory: config.json, and a word-level tokenizer whose ids are ``specials`` first,
    then ``words`` in order (so a swapped pair of words is a different id map of the same size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(special)  # the tokens are in the vocabulary: their ids stay
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": eos, "unk_token": "<unk>"})
    )
    (out / "config.json").write_text(json.dumps({**CONFIG, **(config or {})}))
    return out


def test_probe_is_the_gb2312_level_one_characters_plus_english_and_code() -> None:
    chars = []
    for row in range(0xB0, 0xD8):  # level one: rows 16-55 (0xB0-0xD7), cells 0xA1-0xFE
        for cell in range(0xA1, 0xFF):
            try:
                chars.append(bytes([row, cell]).decode("gb2312"))
            except UnicodeDecodeError:  # 0xD7FA-0xD7FE are empty
                assert row == 0xD7 and cell >= 0xFA
    assert len(chars) == 3755
    probes = probe_texts()
    assert probes["gb2312_level1"].replace("\n", "") == "".join(chars)
    assert set(probes) == {"gb2312_level1", "english", "code"}
    assert "def " in probes["code"] and "fox" in probes["english"]


def check_pair(target: Path, draft: Path) -> TokenizerCheck:
    """Both models' tokenizers read and compared, as the pipeline reads and the planner compares."""
    return check_facts(tokenizer_of(str(target), "target"), tokenizer_of(str(draft), "draft"))


def test_same_tokenizer_agrees(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "t"), make_model(tmp_path / "d")
    check = check_pair(a, b)
    assert check.checked and not check.mismatch and check.shared_ids == len(SPECIALS) + len(WORDS)
    assert "tokenizers agree" in check.summary()


def test_a_different_id_map_is_counted_with_the_first_differing_probe(tmp_path: Path) -> None:
    swapped = [*WORDS]
    swapped[0], swapped[1] = swapped[1], swapped[0]  # "the" and "quick" swap ids 4 and 5
    t = read_tokenizer(str(make_model(tmp_path / "t")))
    d = read_tokenizer(str(make_model(tmp_path / "d", words=swapped)))
    assert not isinstance(t, str) and not isinstance(d, str)
    check = compare(t, d)
    assert check.ids_differ and check.differing_ids == 2 and check.shared_ids == 18
    assert check.id_examples[:2] == ((4, "the", "quick"), (5, "quick", "the"))
    assert (
        check.probe_diff.startswith("probe 'english'")
        and "(target 5 'quick', draft 4 'quick')" in check.probe_diff
    )
    assert "2 of 18 shared ids map to other tokens" in check.summary()


def test_same_map_other_specials_is_a_difference_but_not_of_ids(tmp_path: Path) -> None:
    t = make_model(tmp_path / "t")
    d = make_model(tmp_path / "d", special=SPECIALS[:3], eos="<|im_end|>")
    check = check_pair(t, d)
    assert check.checked and not check.ids_differ and check.mismatch
    assert "'<|im_end|>': target id 3, draft not special" in check.special_diffs
    assert "eos_token: target '</s>', draft '<|im_end|>'" in check.special_diffs


def test_no_tokenizer_json_says_what_was_not_checked(tmp_path: Path) -> None:
    t = make_model(tmp_path / "t")
    d = make_model(tmp_path / "d")
    (d / "tokenizer.json").unlink()
    check = check_pair(t, d)
    assert not check.checked and "has no tokenizer.json (draft)" in check.summary()


def _plan(
    host_of,
    root: Path,
    target: Path,
    draft: Path,
    version: str,
    method: str = "draft_model",
    typed: bool = False,
) -> Any:
    host = host_of("rtx4090-1x")
    host = host._replace(software=host.software._replace(vllm_version=version))
    sets = [f"speculative.method={method}", "engine.max_model_len=1024", "server.vllm_command=vllm"]
    plan = make_plan(host, root, environ={}, model=str(target), draft=str(draft), sets=sets)
    return plan if typed else plan.to_json()


def _why(plan: dict) -> str:
    (why,) = [r["reason"] for r in plan["reasons"] if r["key"] == "speculative.method"]
    return why


def test_plan_same_tokenizer_is_planned(host_of, empty_root, tmp_path: Path) -> None:
    t, d = make_model(tmp_path / "t"), make_model(tmp_path / "d", config={"num_hidden_layers": 1})
    p = _plan(host_of, empty_root, t, d, "0.22.0")
    spec = p["instances"][0]["speculative"]
    assert spec["method"] == "draft_model" and "use_heterogeneous_vocab" not in spec
    assert "tokenizers agree: 18 shared ids" in _why(p)


def test_plan_different_id_map_refused_before_0_25_mapped_after(host_of, empty_root, tmp_path: Path) -> None:
    swapped = [*WORDS]
    swapped[0], swapped[1] = swapped[1], swapped[0]
    t = make_model(tmp_path / "t")
    d = make_model(tmp_path / "d", words=swapped, config={"num_hidden_layers": 1})
    with pytest.raises(PlanRefused) as e:
        _plan(host_of, empty_root, t, d, "0.22.0")
    assert "2 of 18 shared ids map to other tokens" in str(e.value) and "probe 'english'" in str(e.value)
    assert any("0.25" in s for s in e.value.suggestions)
    auto = _plan(host_of, empty_root, t, d, "0.22.0", method="auto")  # auto: ngram, said why
    assert auto["instances"][0]["speculative"]["method"] == "ngram" and auto["draft"] is None
    assert any("2 of 18 shared ids" in w for w in auto["warnings"])
    typed = _plan(host_of, empty_root, t, d, "0.32.0", typed=True)
    new = typed.to_json()
    spec = new["instances"][0]["speculative"]
    assert spec["method"] == "draft_model" and spec["use_heterogeneous_vocab"] is True
    assert "common token strings (use_heterogeneous_vocab)" in _why(new)
    jsonschema.validate(
        new, json.loads((Path(__file__).parents[1] / "schemas/hwprofile.plan-1.schema.json").read_text())
    )
    for version, mapped in (("0.32.0", True), ("0.22.0", False)):  # the render carries the flag
        a = render_instance(typed, typed.instances[0], release(version), "vllm", None).argv
        cfg = json.loads(a[a.index("--speculative-config") + 1])
        assert (cfg["method"], cfg.get("use_heterogeneous_vocab")) == (
            ("draft_model", True) if mapped else ("ngram", None)
        ), version


def test_plan_same_map_other_specials_is_planned_with_a_warning(host_of, empty_root, tmp_path: Path) -> None:
    t = make_model(tmp_path / "t")
    d = make_model(tmp_path / "d", special=SPECIALS[:3], eos="<|im_end|>", config={"num_hidden_layers": 1})
    p = _plan(host_of, empty_root, t, d, "0.22.0")
    assert p["instances"][0]["speculative"]["method"] == "draft_model"
    assert "use_heterogeneous_vocab" not in p["instances"][0]["speculative"]
    (w,) = [w for w in p["warnings"] if "maps every shared id" in w]
    assert "eos_token: target '</s>', draft '<|im_end|>'" in w
