"""Does a draft model speak the target's tokens? Beyond ``vocab_size``: the two ``tokenizer.json``
files compared with the ``tokenizers`` library (imported lazily; it comes with vLLM).

vLLM's ``draft_model`` speculation hands the target's token ids to the draft and the draft's ids
back to the target unchanged (only ``vocab_size`` is checked, 0.15+ ``config/speculative.py``). Ids
that mean other text in the draft make proposals the target rejects: pure cost. vLLM 0.25+ can map
the two vocabularies through their shared token strings instead (``use_heterogeneous_vocab``,
``v1/spec_decode/vocab_mapping.py``: tokens compared after the word-start marker ``Ġ``/``▁`` is made
a space).

Three things are compared:

- the id→token map over the ids both tokenizers have (added tokens included);
- the special tokens: added tokens marked special, and the ``bos``/``eos``/``unk``/``pad`` roles of
  ``tokenizer_config.json``;
- the encodings of the shipped probe texts (``hwprofile/data/tokenizer_probe.json``: the 3,755
  GB2312 level-one characters, an English paragraph, a code snippet), without special tokens.

The reader (:func:`read_tokenizer`) takes a model directory; :func:`compare` is pure.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json (the largest real ones are ~30 MB)
MAX_CONFIG_BYTES = 4 << 20
ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
SPACE_MARKERS = ("\u0120", "\u2581")  # byte-level BPE's Ġ, SentencePiece's ▁


class TokenizerFacts(NamedTuple):
    """What the check needs from one tokenizer."""

    path: str
    tokens: tuple[str | None, ...]  # id → token (None: an id the tokenizer does not define)
    specials: dict[str, int]  # special added token → id
    roles: dict[str, str]  # bos_token/eos_token/... → token text (tokenizer_config.json)
    probes: dict[str, tuple[int, ...]]  # probe name → ids (no special tokens added)


class TokenizerCheck(NamedTuple):
    """The comparison of a target's and a draft's tokenizer. ``checked`` false: ``why`` says what was
    not compared."""

    checked: bool
    why: str = ""
    shared_ids: int = 0  # ids both define
    differing_ids: int = 0  # of those, ids whose token differs
    id_examples: tuple[tuple[int, str | None, str | None], ...] = ()  # (id, target's, draft's)
    special_diffs: tuple[str, ...] = ()  # one line per differing special token or role
    probe_diff: str = ""  # the first probe that encodes differently, where
    common_tokens: int = 0  # token strings both have (vLLM's VocabMapping intersection)
    target_size: int = 0
    draft_size: int = 0

    @property
    def ids_differ(self) -> bool:
        """The same id means other text (or the probes split differently): proposals are wasted."""
        return self.checked and bool(self.differing_ids or self.probe_diff)

    @property
    def mismatch(self) -> bool:
        return self.checked and bool(self.differing_ids or self.probe_diff or self.special_diffs)

    def summary(self) -> str:
        """One sentence with the numbers."""
        if not self.checked:
            return f"tokenizers not compared: {self.why}"
        if not self.mismatch:
            return (
                f"tokenizers agree: {self.shared_ids} shared ids map to the same tokens, the same special "
                "tokens, the probe texts (GB2312 level one, English, code) encode to the same ids"
            )
        parts = []
        if self.differing_ids:
            ex = ", ".join(f"id {i}: {t!r} vs {d!r}" for i, t, d in self.id_examples[:3])
            parts.append(f"{self.differing_ids} of {self.shared_ids} shared ids map to other tokens ({ex})")
        if self.special_diffs:
            parts.append("special tokens differ: " + "; ".join(self.special_diffs[:4]))
        if self.probe_diff:
            parts.append(self.probe_diff)
        return "tokenizers differ: " + "; ".join(parts)


def probe_texts() -> dict[str, str]:
    """The shipped probe texts, by name."""
    from importlib import resources  # with tempfile, shutil, random: only where a draft is compared

    text = resources.files("hwprofile.data").joinpath("tokenizer_probe.json").read_text(encoding="utf-8")
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def _read_json(path: str, limit: int) -> Any:
    if os.path.getsize(path) > limit:
        raise ValueError(f"{path}: larger than {limit} bytes")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _role_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


_CACHE: dict[tuple[str, int, int], TokenizerFacts] = {}


def read_tokenizer(model_dir: str) -> TokenizerFacts | str:
    """The facts of ``model_dir``'s ``tokenizer.json`` (and ``tokenizer_config.json``), or why none:
    a string naming what is missing. Cached per file (path, size, mtime) for the process."""
    tj = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(tj):
        return f"{model_dir} has no tokenizer.json"
    st = os.stat(tj)
    key = (os.path.realpath(tj), st.st_size, st.st_mtime_ns)
    if key in _CACHE:
        return _CACHE[key]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return "the tokenizers library is not installed (pip install tokenizers)"
    if st.st_size > MAX_TOKENIZER_BYTES:
        return f"{tj} is larger than {MAX_TOKENIZER_BYTES >> 20} MiB"
    try:
        tok = Tokenizer.from_file(tj)
        raw = _read_json(tj, MAX_TOKENIZER_BYTES)
    except Exception as e:  # a tokenizer.json the library cannot load: not compared, said why
        return f"{tj} does not load: {e}"
    size = tok.get_vocab_size(with_added_tokens=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(size, 1 + max(vocab.values(), default=-1))
    tokens: list[str | None] = [None] * size
    for t, i in vocab.items():
        tokens[i] = t
    specials = {
        a["content"]: int(a["id"])
        for a in (raw.get("added_tokens") or [])
        if isinstance(a, dict) and a.get("special") and isinstance(a.get("content"), str)
    }
    roles: dict[str, str] = {}
    tc = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(tc):
        try:
            cfg = _read_json(tc, MAX_CONFIG_BYTES)
        except (ValueError, OSError):
            cfg = {}
        for role in ROLES:
            text = _role_text(cfg.get(role)) if isinstance(cfg, dict) else None
            if text is not None:
                roles[role] = text
    probes = {
        name: tuple(tok.encode(text, add_special_tokens=False).ids) for name, text in probe_texts().items()
    }
    facts = TokenizerFacts(model_dir, tuple(tokens), specials, roles, probes)
    _CACHE[key] = facts
    return facts


def _normalize(token: str) -> str:
    for m in SPACE_MARKERS:
        if token.startswith(m):
            return " " + token[len(m) :]
    return token


def _piece(f: TokenizerFacts, ids: tuple[int, ...], pos: int) -> str:
    if pos >= len(ids):
        return "end"
    i = ids[pos]
    return f"{i} {f.tokens[i] if 0 <= i < len(f.tokens) else None!r}"


def _first_probe_diff(target: TokenizerFacts, draft: TokenizerFacts) -> str:
    """The first probe the two encode differently: its length, both id counts, the first token
    that differs (id and token text on each side)."""
    texts = probe_texts()
    for name, t_ids in target.probes.items():
        d_ids = draft.probes.get(name)
        if d_ids is None or d_ids == t_ids:
            continue
        pairs = zip(t_ids, d_ids, strict=False)
        pos = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(t_ids), len(d_ids)))
        return (
            f"probe {name!r} ({len(texts.get(name, ''))} characters) encodes to {len(t_ids)} ids "
            f"in the target, {len(d_ids)} in the draft, first differing at token {pos} "
            f"(target {_piece(target, t_ids, pos)}, draft {_piece(draft, d_ids, pos)})"
        )
    return ""


def _where(token_id: int | None) -> str:
    return "not special" if token_id is None else f"id {token_id}"


def compare(target: TokenizerFacts, draft: TokenizerFacts) -> TokenizerCheck:
    """Target and draft tokenizers compared (pure)."""
    shared = min(len(target.tokens), len(draft.tokens))
    differing = [i for i in range(shared) if target.tokens[i] != draft.tokens[i]]
    examples = tuple((i, target.tokens[i], draft.tokens[i]) for i in differing[:5])
    specials: list[str] = []
    for content in sorted(set(target.specials) | set(draft.specials)):
        t, d = target.specials.get(content), draft.specials.get(content)
        if t != d:
            specials.append(f"{content!r}: target {_where(t)}, draft {_where(d)}")
    for role in ROLES:
        tr, dr = target.roles.get(role), draft.roles.get(role)
        if tr != dr and tr is not None and dr is not None:
            specials.append(f"{role}: target {tr!r}, draft {dr!r}")
    t_norm = {_normalize(x) for x in target.tokens if x is not None}
    d_norm = {_normalize(x) for x in draft.tokens if x is not None}
    return TokenizerCheck(
        checked=True,
        shared_ids=shared,
        differing_ids=len(differing),
        id_examples=examples,
        special_diffs=tuple(specials),
        probe_diff=_first_probe_diff(target, draft),
        common_tokens=len(t_norm & d_norm),
        target_size=len(target.tokens),
        draft_size=len(draft.tokens),
    )


def tokenizer_of(model_dir: str | None, role: str) -> TokenizerFacts | str:
    """The facts of a model's tokenizer (a local directory's ``tokenizer.json``), or why there are
    none: what the pipeline reads for the planner, which compares (:func:`check_facts`)."""
    if not model_dir or not os.path.isdir(model_dir):
        return f"the {role} is not a local directory ({model_dir or 'no path'})"
    t = read_tokenizer(model_dir)
    return f"{t} ({role})" if isinstance(t, str) else t


def check_facts(target: TokenizerFacts | str | None, draft: TokenizerFacts | str | None) -> TokenizerCheck:
    """The comparison of two tokenizers read before (pure); ``checked`` false with why where either
    could not be read (a string) or was not (None)."""
    for t in (target, draft):
        if t is None:
            return TokenizerCheck(False, "the tokenizers were not read")
        if isinstance(t, str):
            return TokenizerCheck(False, t)
    assert isinstance(target, TokenizerFacts) and isinstance(draft, TokenizerFacts)
    return compare(target, draft)
