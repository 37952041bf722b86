"""A checkpoint's quantization (:func:`read_quant`) and the bytes each linear weight takes under it
(:meth:`Scheme.nbytes`).

The formats: compressed-tensors (pack-quantized / int-quantized /
float-quantized / nvfp4, ``config_groups`` with targets, ``ignore`` with ``re:`` regexes matched by
RE2 the way vLLM's ``is_equal_or_regex_match`` matches: from the name's start), FP8 (per tensor or
``weight_block_size`` blocks; ``modules_to_not_convert``/``ignored_layers``), ModelOpt NVFP4 / FP8
(``quant_algo``, ``exclude_modules`` as shell patterns), MXFP4 (gpt-oss: the experts only, 4 bits and
one uint8 scale per 32), AWQ, GPTQ (packed zeros, ``g_idx``), AutoRound's own format (``bits``,
``group_size``, ``extra_config`` per layer), bitsandbytes (4-bit nf4/fp4, 8-bit) and AMD Quark (its
global weight spec, ``layer_quant_config`` patterns, ``exclude``).

Pure: dicts in, numbers out.
"""

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from .layers import is_dsv4, is_dsv41
from .tensor import Tensor


class Scheme(NamedTuple):
    """How one linear weight is stored."""

    bits: int  # weight bits (16: not quantized)
    group: int = 0  # weights per scale along the input (0: per output channel)
    scale_bytes: float = 2.0  # bytes per scale
    zero_bits: int = 0  # bits per zero point (0: symmetric)
    block: tuple[int, int] | None = None  # 2-D blocks (FP8 block): one scale per block
    per_tensor: bool = False  # one scale per tensor
    g_idx: bool = False  # GPTQ: one int32 group index per input column
    second_scale: float = 0.0  # NVFP4: one fp32 global scale per tensor

    def nbytes(self, t: Tensor) -> float:
        n = t.rows * t.cols
        if self.bits >= 16:
            return 2.0 * n * t.count
        b = n * self.bits / 8
        if self.block:
            b += -(-t.rows // self.block[0]) * -(-t.cols // self.block[1]) * self.scale_bytes
        elif self.per_tensor:
            b += self.scale_bytes
        elif self.group:
            groups = t.rows * -(-t.cols // self.group)
            b += groups * (self.scale_bytes + self.zero_bits / 8)
        else:
            b += t.rows * (self.scale_bytes + self.zero_bits / 8)
        if self.g_idx:
            b += 4 * t.cols
        b += self.second_scale
        return b * t.count


BF16 = Scheme(16)


class Quant(NamedTuple):
    """A checkpoint's quantization: which linear weights it quantizes and how."""

    method: str | None  # quant_method as vLLM names it (None: unquantized)
    bits: int | None  # bits of the quantized linear weights (the widest group where mixed)
    rules: tuple[tuple[str, tuple[str, ...], Scheme], ...]  # (match mode, patterns, scheme), first wins
    ignore: tuple[str, ...]  # names/patterns that stay 16-bit
    ignore_mode: str  # "ct" (exact or re:), "fnmatch", "boundary" (exact, prefix or suffix at a dot)
    experts_only: bool = False  # MXFP4 (gpt-oss): only the experts are quantized
    notes: tuple[str, ...] = ()
    lm_head: bool = False  # the LM head quantized too (GPTQ/AutoRound ``lm_head: true``): vLLM's
    # ParallelLMHead is no LinearBase, so no other method quantizes it
    mxfp4_moe: bool = False  # the routed experts run on vLLM's Mxfp4MoEMethod, which pads their shapes
    # to its kernel's tile (gpt-oss's mxfp4, DeepSeek V4's fp4 experts, Kimi-K3's rewritten one; not
    # compressed-tensors' own W4A4 MXFP4 method)

    def scheme(self, t: Tensor) -> Scheme:
        """How ``t`` is stored (for many tensors, :meth:`chooser` compiles the lists once)."""
        return self.chooser()(t)

    def chooser(self) -> Any:
        """``f(tensor) -> Scheme`` with the ignore list and the targets compiled once."""
        ignore = _Matcher(self.ignore, self.ignore_mode)
        rules = [(_Matcher(p, mode) if p else None, scheme) for mode, p, scheme in self.rules]

        def choose(t: Tensor) -> Scheme:
            if not t.linear or not self.method or (t.part == "lm_head" and not self.lm_head):
                return BF16
            if (self.experts_only and t.count == 1) or ignore(t.name):
                return BF16
            return next((scheme for m, scheme in rules if m is None or m(t.name)), BF16)

        return choose


def _re2(pattern: str) -> Any:
    import re2

    opts = re2.Options()
    opts.log_errors = False
    try:
        return re2.compile(pattern, opts)
    except re2.error:
        return None  # RE2 cannot say it (look-around): it matches nothing here


def _glob(pat: str) -> str:
    """A shell pattern (``*``, ``?``, ``[...]``) as an RE2 expression over the whole name
    (``fnmatch.translate`` writes atomic groups, which RE2 does not have)."""
    out: list[str] = []
    i = 0
    while i < len(pat):
        ch = pat[i]
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[" and pat.find("]", i + 2) > 0:
            j = pat.find("]", i + 2)
            body = pat[i + 1 : j]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = j
        else:
            out.append(re.escape(ch))
        i += 1
    return "(?s:" + "".join(out) + ")\\z"


class _Matcher:
    """A list of module names and patterns compiled once: exact names in a set (checkpoints list
    tens of thousands), patterns as RE2 expressions (linear time whatever a config holds).

    Modes: ``ct`` (compressed-tensors and vLLM's ``is_equal_or_regex_match``: the exact name, or
    ``re:`` matched from the name's start; the class name ``Linear`` matches every linear layer),
    ``fnmatch`` (ModelOpt: shell patterns over the whole name), ``boundary`` (FP8, AWQ, GPTQ,
    bitsandbytes skip lists: a run of whole dotted components of the name, e.g. ``lm_head`` or
    ``model.visual``; ``re:`` searched anywhere)."""

    def __init__(self, patterns: tuple[str, ...], mode: str) -> None:
        self.mode = mode
        self.exact: set[str] = set()
        self.regexes: list[Any] = []
        self.every = False
        for pat in patterns:
            if pat.startswith("re:") and mode != "fnmatch":
                rx = _re2(pat[3:])
                if rx is not None:
                    self.regexes.append(rx)
            elif mode == "ct" and pat == "Linear":
                self.every = True
            elif mode == "fnmatch" and any(ch in pat for ch in "*?["):
                rx = _re2(_glob(pat))
                if rx is not None:
                    self.regexes.append(rx)
            else:
                self.exact.add(pat)

    def __call__(self, name: str) -> bool:
        if self.every or name in self.exact:
            return True
        if self.mode == "boundary" and self.exact:
            parts = name.split(".")
            n = len(parts)
            if any(".".join(parts[i:j]) in self.exact for i in range(n) for j in range(i + 1, n + 1)):
                return True
        if self.mode == "ct" or self.mode == "fnmatch":
            return any(rx.match(name) for rx in self.regexes)
        return any(rx.search(name) for rx in self.regexes)


def _qint(q: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    v = q.get(key)
    if v is None:
        return default
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"quantization_config.{key}: expected an integer from {lo} to {hi}, got {v!r}"[:160])
    return v


def _strs(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list):
        return tuple(x for x in v if isinstance(x, str))
    return ()


def read_quant(cfg: dict[str, Any]) -> Quant:
    """The checkpoint's quantization from ``quantization_config`` (the text config's, or the
    wrapper's). Unknown methods: linear weights at ``bits`` (or 16) with group-128 scales, noted."""
    q = cfg.get("quantization_config")
    text = cfg.get("text_config")
    if not isinstance(q, dict) and isinstance(text, dict):
        q = text.get("quantization_config")
    if not isinstance(q, dict) or not q:
        return Quant(None, None, (), (), "ct")
    raw = q.get("quant_method")
    method = raw.lower() if isinstance(raw, str) else ""
    _check_modelopt_mixed(q, method)
    quant = _quant_reader(method, q)(q, method)
    inner = text if isinstance(text, dict) else cfg
    if method == "fp8" and (is_dsv4(inner) or is_dsv41(inner)):
        quant = _dsv4_experts(quant, inner.get("expert_dtype", cfg.get("expert_dtype")))
    if str(cfg.get("model_type")) == "kimi_k3" and "mxfp4" in str(q.get("format") or ""):
        # vLLM's KimiK3 config rewrites its compressed-tensors MXFP4 to quant_method mxfp4
        quant = quant._replace(mxfp4_moe=True)
    return quant


def _dsv4_experts(quant: Quant, expert_dtype: object) -> Quant:
    """DeepSeek V4's FP8 checkpoints keep the routed experts in MXFP4 unless ``expert_dtype`` says
    otherwise (vLLM's ``DeepseekV4FP8Config``: ``expert_dtype`` "fp4" by default; 4 bits and one
    E8M0 scale per 32 weights)."""
    if expert_dtype not in (None, "fp4"):
        return quant
    rule = ("ct", (r"re:.*\.experts\..*",), Scheme(4, group=32, scale_bytes=1))
    note = "routed experts in MXFP4 (DeepSeek V4's expert_dtype fp4, its default)"
    return quant._replace(rules=(rule, *quant.rules), notes=(*quant.notes, note), mxfp4_moe=True)


def _check_modelopt_mixed(q: dict[str, Any], method: str) -> None:
    """A ModelOpt MIXED_PRECISION checkpoint names each layer's algorithm in ``quantized_layers``
    (at the top, or under ``quantization`` where that is given); vLLM refuses one without it
    ("MIXED_PRECISION quant_algo requires a non-empty 'quantized_layers' mapping":
    ModelOptMixedPrecisionConfig), so hwprofile refuses it too rather than plan what will not load."""
    inner = q.get("quantization")
    src = inner if isinstance(inner, dict) else q
    if not method.startswith("modelopt") or str(src.get("quant_algo") or "").upper() != "MIXED_PRECISION":
        return
    layers = src.get("quantized_layers")
    if not (isinstance(layers, dict) and layers):
        where = "quantization_config.quantization" if src is inner else "quantization_config"
        raise ValueError(
            f"{where}: quant_algo MIXED_PRECISION without a quantized_layers mapping (each layer's "
            "algorithm): vLLM refuses to load such a checkpoint; its ModelOpt export writes one"
        )


def _quant_reader(method: str, q: dict[str, Any]) -> Callable[[dict[str, Any], str], Quant]:
    """Which method's reader reads ``q``: compressed-tensors' ``config_groups`` first, then FP8 and
    MXFP4 by name, then ModelOpt's ``quant_algo`` over any other name, then the name."""
    if method == "compressed-tensors" or "config_groups" in q:
        return _ct_quant
    reader = _QUANT_READERS.get(method)
    if "quant_algo" in q and reader not in (_fp8_quant, _mxfp4_quant):
        return _modelopt_quant
    return reader or _other_quant


def _ct_quant(q: dict[str, Any], method: str) -> Quant:
    return _compressed_tensors(q, method or "compressed-tensors")


def _fp8_quant(q: dict[str, Any], method: str) -> Quant:
    """FP8 (and FBGEMM's): block scales where ``weight_block_size`` says, else one per tensor."""
    block = q.get("weight_block_size")
    ignore = _strs(q.get("ignored_layers")) or _strs(q.get("modules_to_not_convert"))
    if isinstance(block, list) and len(block) == 2 and all(type(x) is int and x > 0 for x in block):
        scheme = Scheme(8, block=(block[0], block[1]), scale_bytes=4)
    else:
        scheme = Scheme(8, per_tensor=True, scale_bytes=4)
    return Quant(method, 8, (("ct", (), scheme),), ignore, "boundary")


def _mxfp4_quant(q: dict[str, Any], method: str) -> Quant:
    """gpt-oss: experts in MXFP4, one uint8 (E8M0) scale per 32 weights."""
    return Quant(
        method,
        4,
        (("ct", (), Scheme(4, group=32, scale_bytes=1)),),
        (),
        "ct",
        experts_only=True,
        mxfp4_moe=True,
    )


def _modelopt_quant(q: dict[str, Any], method: str) -> Quant:
    """NVIDIA ModelOpt: NVFP4, FP8 or INT8 by ``quant_algo``, else ``bits``, else 16-bit noted."""
    algo = str(q.get("quant_algo") or (q.get("quantization") or {}).get("quant_algo") or "").upper()
    ignore = _strs(q.get("exclude_modules")) or _strs(q.get("ignore"))
    if "FP4" in algo or method == "modelopt_fp4":
        group = _qint(q, "group_size", 1, 1 << 20, 16) or 16
        scheme = Scheme(4, group=group, scale_bytes=1, second_scale=8)
        return Quant(
            "modelopt_fp4" if method == "modelopt_fp4" else method,
            4,
            (("ct", (), scheme),),
            ignore,
            "fnmatch",
        )
    if "FP8" in algo or "INT8" in algo:
        return Quant(method, 8, (("ct", (), Scheme(8, per_tensor=True, scale_bytes=4)),), ignore, "fnmatch")
    bits = _qint(q, "bits", 1, 16)
    if bits:
        return Quant(method, bits, (("ct", (), Scheme(bits, group=128)),), ignore, "fnmatch")
    return Quant(
        method, None, (), (), "ct", notes=(f"ModelOpt algorithm {algo or '?'} not read: 16-bit assumed",)
    )


def _awq_quant(q: dict[str, Any], method: str) -> Quant:
    """AWQ: ``bits`` (or ``w_bit``) with zero points, group 128 unless said."""
    bits = _qint(q, "bits", 1, 16) or _qint(q, "w_bit", 1, 16) or 4
    group = _qint(q, "group_size", -1, 1 << 20) or _qint(q, "q_group_size", -1, 1 << 20) or 128
    zero = bits if q.get("zero_point", True) is not False else 0
    scheme = Scheme(bits, group=max(group, 0), scale_bytes=2, zero_bits=zero)
    return Quant(method, bits, (("ct", (), scheme),), _strs(q.get("modules_to_not_convert")), "boundary")


def _gptq_quant(q: dict[str, Any], method: str) -> Quant:
    """GPTQ and AutoRound: ``bits`` with zero points (and GPTQ's g_idx), AutoRound's per-layer
    overrides, GPTQModel's skipped layers."""
    bits = _qint(q, "bits", 1, 16) or 4
    group = _qint(q, "group_size", -1, 1 << 20, 128) or 128
    gptq = method.startswith("gptq")
    scheme = Scheme(bits, group=max(group, 0), scale_bytes=2, zero_bits=bits, g_idx=gptq)
    extra: dict[str, Any] = q["extra_config"] if isinstance(q.get("extra_config"), dict) else {}
    rules, ignore = _autoround_overrides(extra, scheme)
    dyn: dict[Any, Any] = q["dynamic"] if isinstance(q.get("dynamic"), dict) else {}
    for pat in dyn:  # GPTQModel: "-:regex" skips, "+:regex" overrides
        if isinstance(pat, str) and pat.startswith("-:"):
            ignore.append("re:" + pat[2:])
    keep = [p if p.startswith("re:") or not any(ch in p for ch in "*[(\\") else "re:" + p for p in ignore]
    name = "gptq" if gptq else "auto-round" if "round" in method else method
    head = q.get("lm_head") is True
    return Quant(name, bits, (*rules, ("ct", (), scheme)), tuple(keep), "boundary", lm_head=head)


def _autoround_overrides(
    extra: dict[str, Any], scheme: Scheme
) -> tuple[list[tuple[str, tuple[str, ...], Scheme]], list[str]]:
    """AutoRound's ``extra_config``: per-layer bits (16 = kept in 16 bits) as rules, and the layers kept."""
    rules: list[tuple[str, tuple[str, ...], Scheme]] = []
    ignore: list[str] = []
    for name, over in extra.items():
        if not isinstance(over, dict):
            continue
        b = over.get("bits")
        if type(b) is int and b >= 16:
            ignore.append(name)
        elif type(b) is int and 1 <= b < 16:
            g = over.get("group_size")
            rules.append(
                (
                    "boundary",
                    (name,),
                    scheme._replace(
                        bits=b, zero_bits=b, group=g if type(g) is int and g > 0 else scheme.group
                    ),
                )
            )
    return rules, ignore


def _bnb_quant(q: dict[str, Any], method: str) -> Quant:
    """bitsandbytes: 8-bit, or 4-bit (nf4/fp4) with one fp32 absmax per 64 weights, or an 8-bit
    one (+ small fp32 tables)."""
    skip = _strs(q.get("llm_int8_skip_modules"))
    if q.get("load_in_8bit") is True:
        return Quant(method, 8, (("ct", (), Scheme(8, scale_bytes=4)),), skip, "boundary")
    double = q.get("bnb_4bit_use_double_quant") is True
    scheme = Scheme(4, group=64, scale_bytes=1.0 + 4 / 256 if double else 4.0)
    return Quant(method, 4, (("ct", (), scheme),), skip, "boundary")


def _quark_scheme(spec: object) -> Scheme | None:
    """One AMD Quark weight spec (``{"dtype", "qscheme", "group_size", ...}``; a list: its first)
    as stored: FP8/INT8 per tensor or channel, INT4/UINT4 per group (zero points where unsigned),
    MXFP4 and MXFP6 (``fp4``, ``fp6_e3m2``, ``fp6_e2m3``) in groups of 32 with an 8-bit shared
    exponent; None where it says no width."""
    w = spec[0] if isinstance(spec, list) and spec else spec
    if not isinstance(w, dict):
        return None
    dtype = str(w.get("dtype") or "").lower()
    bits = next((b for b in (8, 6, 4) if str(b) in dtype), 0)
    if not bits:
        return None
    qscheme = str(w.get("qscheme") or "").lower()
    group = _qint(w, "group_size", 1, 1 << 20) or 0
    if dtype.startswith(("fp4", "mxfp4", "fp6", "mxfp6")) or "mx" in qscheme:  # OCP MX: an e8m0 per 32
        return Scheme(bits, group=group or 32, scale_bytes=1)
    if "tensor" in qscheme:
        return Scheme(bits, per_tensor=True, scale_bytes=4)
    if "group" in qscheme:
        return Scheme(bits, group=group or 128, zero_bits=bits if dtype.startswith("u") else 0)
    return Scheme(bits, scale_bytes=4 if dtype.startswith("fp") else 2)


def _quark_quant(q: dict[str, Any], method: str) -> Quant:
    """AMD Quark (``quark.py``): ``layer_quant_config`` patterns first (fnmatch over the module
    name), then ``global_quant_config``; ``exclude`` stays 16-bit, each entry an exact module name or
    a ``re:`` expression (``quark/utils.py`` ``should_ignore_layer``; no shell patterns)."""
    rules: list[tuple[str, tuple[str, ...], Scheme]] = []
    per_layer = q.get("layer_quant_config")
    if isinstance(per_layer, dict):
        for pattern, cfg in list(per_layer.items())[:1000]:
            scheme = _quark_scheme(cfg.get("weight")) if isinstance(cfg, dict) else None
            if isinstance(pattern, str) and scheme is not None:
                rules.append(("fnmatch", (pattern,), scheme))
    glob = q.get("global_quant_config")
    main = _quark_scheme(glob.get("weight")) if isinstance(glob, dict) else None
    if main is not None:
        rules.append(("fnmatch", (), main))
    if not rules:
        return Quant(method, None, (), (), "ct", notes=("Quark: no weight dtype read: 16 bits assumed",))
    bits = max(scheme.bits for _, _, scheme in rules)
    return Quant(method, bits, tuple(rules), _strs(q.get("exclude")), "ct")


def _other_quant(q: dict[str, Any], method: str) -> Quant:
    """A method hwprofile does not know: linear weights at ``bits`` with group-128 scales, noted;
    16 bits where no width is said."""
    bits = _qint(q, "bits", 1, 16) or _qint(q, "w_bit", 1, 16)
    if bits:
        note = (
            f"quant_method {method or '?'}: linear weights taken at {bits} bits with group-128 16-bit scales"
        )
        return Quant(method or None, bits, (("ct", (), Scheme(bits, group=128)),), (), "ct", notes=(note,))
    return Quant(
        method or None,
        None,
        (),
        (),
        "ct",
        notes=(f"quant_method {method or '?'}: weight width unknown: 16 bits assumed",),
    )


_QUANT_READERS: dict[str, Callable[[dict[str, Any], str], Quant]] = {
    "fp8": _fp8_quant,
    "fbgemm_fp8": _fp8_quant,
    "mxfp4": _mxfp4_quant,
    "modelopt": _modelopt_quant,
    "modelopt_fp4": _modelopt_quant,
    "awq": _awq_quant,
    "awq_marlin": _awq_quant,
    **dict.fromkeys(
        ("gptq", "gptq_marlin", "auto-round", "intel/auto-round", "autoround", "inc"), _gptq_quant
    ),
    "bitsandbytes": _bnb_quant,
    "quark": _quark_quant,
}


def _ct_scheme(w: dict[str, Any], fmt: str) -> Scheme:
    bits = w.get("num_bits")
    if type(bits) is not int or not 1 <= bits <= 16:
        raise ValueError(
            f"quantization_config.config_groups.*.weights.num_bits: expected 1 to 16, got {bits!r}"[:160]
        )
    typ = str(w.get("type") or "int").lower()
    group = w.get("group_size")
    group = group if type(group) is int and group > 0 else 0
    # no strategy said: group where a group size is given, else tensor (compressed-tensors'
    # QuantizationArgs; ModelOpt's MIXED_PRECISION export writes NVFP4 groups so: no strategy key)
    strategy = str(w.get("strategy") or ("group" if group else "tensor")).lower()
    sym = w.get("symmetric", True) is not False
    fp4 = typ == "float" and bits == 4  # nvfp4 / mxfp4: fp8 (or E8M0) scales
    scale = 1.0 if fp4 else 2.0
    zero = 0 if sym or typ == "float" else 8 if "pack" not in fmt else bits
    if strategy == "block":
        blk = w.get("block_structure")
        if isinstance(blk, list) and len(blk) == 2 and all(type(x) is int and x > 0 for x in blk):
            return Scheme(bits, block=(blk[0], blk[1]), scale_bytes=4)
    if strategy == "tensor":
        return Scheme(bits, per_tensor=True, scale_bytes=4)
    if strategy == "channel":
        return Scheme(bits, scale_bytes=scale, zero_bits=zero)
    return Scheme(bits, group=group or 128, scale_bytes=scale, zero_bits=zero, second_scale=4 if fp4 else 0)


def _compressed_tensors(q: dict[str, Any], method: str) -> Quant:
    groups = q.get("config_groups")
    fmt = str(q.get("format") or "").lower()
    rules: list[tuple[str, tuple[str, ...], Scheme]] = []
    widest = 0
    if isinstance(groups, dict):
        for g in groups.values():
            if not isinstance(g, dict) or not isinstance(g.get("weights"), dict):
                continue
            scheme = _ct_scheme(g["weights"], str(g.get("format") or fmt))
            targets = _strs(g.get("targets")) or ("Linear",)
            rules.append(("ct", targets, scheme))
            widest = max(widest, scheme.bits)
    mode = "fnmatch" if method.startswith("modelopt") else "ct"  # ModelOpt's own export: shell patterns
    return Quant(method, widest or None, tuple(rules), _strs(q.get("ignore")), mode)
