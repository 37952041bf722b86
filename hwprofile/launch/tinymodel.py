"""A tiny Llama-architecture model and tokenizer generated offline (no model hub needed).

Used by the test suite and by hwprofile's first-run demo to serve something real with vLLM on the
CPU. With a fixed seed the files are byte-identical run to run, so greedy outputs are stable.
The weights are random: what it generates is gibberish by design. The tokenizer fills the whole
vocabulary (``vocab_size`` ids) with visible pieces, so every id the model can emit decodes to text.
Needs ``tokenizers``, ``transformers`` and ``torch`` (they come with vLLM); imported lazily.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..runtime.dirs import cache_dir

DEFAULT_DIR = cache_dir() / "tiny-llama"

# Shape: 2 layers, hidden 128, 4 heads of 32 (vLLM's CPU attention supports head size 32),
# 2 KV heads, so KV bytes per token = 2 x 2 layers x 2 heads x 32 x 2 bytes = 512.
CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 2048,
}

_TEXT = (
    """hwprofile plans vLLM launches for the hardware it finds. The quick brown fox jumps over the lazy dog.
Speculative decoding proposes tokens with a small model and verifies them with the large one.
Memory bandwidth bounds decoding at batch one; batching shares each weight read among requests.
The KV cache holds keys and values of every token; its size is layers times heads times head size.
"""
    * 40
)

# Pseudo-words (two consonant-vowel syllables each, 4900 of them) beside the text above: enough
# distinct pieces for byte-level BPE to fill all 2048 ids. Trained on ``_TEXT`` alone it stops at 235,
# and the ids above that (88 % of what random weights emit) decode to nothing.
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
_WORDS = [a + b for a, b in itertools.product(_SYLLABLES, repeat=2)]
_FILLER = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 12)]

# Bumped when the generated files change: a cached model of another format is made again.
FORMAT = 2

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_model_ready(out: Path = DEFAULT_DIR) -> bool:
    """The tiny model is already at ``out`` in the current format (:func:`make_tiny_model` returns it as is)."""
    out = Path(out)
    return (
        (out / "config.json").is_file() and (out / "model.safetensors").is_file() and _format(out) == FORMAT
    )


def make_tiny_model(out: Path = DEFAULT_DIR, seed: int = 1234, config: dict[str, int] | None = None) -> Path:
    """Write tokenizer + random-weight LlamaForCausalLM (bf16 safetensors) to ``out``; idempotent."""
    out = Path(out)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        if _format(out) == FORMAT:
            return out
        stale = out.with_name(out.name + f".stale{os.getpid()}")
        out.rename(stale)  # a model of an older format: made again below
        shutil.rmtree(stale, ignore_errors=True)
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    cfg: dict[str, Any] = {**CONFIG, **(config or {})}
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=cfg["vocab_size"], special_tokens=special, show_progress=False)
    tok.train_from_iterator(_TEXT.splitlines() + _FILLER, trainer=trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)

    torch.manual_seed(seed)
    lc = LlamaConfig(
        **cfg,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(lc).bfloat16()
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" for a 2 MB file is noise
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (tmp / "hwprofile-tiny.json").write_text(json.dumps({"format": FORMAT, "seed": seed, "config": cfg}))
    if out.exists():  # made meanwhile by another process
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(out)
    return out


def _format(out: Path) -> int | None:
    try:
        return json.loads((out / "hwprofile-tiny.json").read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None


if __name__ == "__main__":
    import sys

    print(make_tiny_model(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
