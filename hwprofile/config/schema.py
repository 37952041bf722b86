"""The settings a profile, an overrides file, the environment or ``--set`` may give, with their
types, ranges, choices and defaults. Validation names the file and line and suggests the closest
valid key.

Every setting's default lives here and only here (``Field.default``): ``with_defaults`` fills
whatever the layers left unset, so code reads a setting without a fallback of its own, and an
explicit 0 is honoured where the range allows it. Text that can reach a rendered file (argv, the
shell line, an environment file, a systemd unit) never holds a control character; numbers are
finite."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from . import ConfigError, Source

if TYPE_CHECKING:
    from typing import Any


class Field(NamedTuple):
    kind: str  # float, int, bool, str, text, choice, size, int_or_auto, k_table, str_list
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    default: Any = None  # the one default of the setting (sizes in bytes)
    pattern: str = ""  # str: the whole value must match this regular expression
    pattern_doc: str = ""  # what the pattern means, for the error message


KV_CACHE_DTYPES = ("auto", "fp8_if_supported", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
QUANTIZATIONS = (
    "auto", "none", "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors",
    "bitsandbytes", "gguf", "modelopt", "mxfp4",
)  # fmt: skip
SPEC_METHODS = ("auto", "none", "draft_model", "ngram", "eagle", "eagle3", "mtp", "suffix")
LAYOUTS = ("auto", "single", "tensor_parallel", "numa_pairs", "replicas")

MiB = 2**20
MAX_SIZE = 2**50  # 1 PiB: a larger size is a typo
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

SETTINGS: dict[tuple[str, ...], Field] = {
    # -- engine ----------------------------------------------------------------------------
    ("engine", "gpu_memory_utilization"): Field(
        "float", "share of each GPU's TOTAL memory for the instance", 0.05, 0.99, default=0.90
    ),
    ("engine", "max_model_len"): Field(
        "int", "context length (prompt + output) per request", 16, 10_485_760, default=8192
    ),
    ("engine", "min_model_len"): Field(
        "int", "shortest context the planner may fall back to before refusing", 16, 10_485_760, default=2048
    ),
    ("engine", "max_num_seqs"): Field("int", "concurrent sequences per instance", 1, 65_536, default=256),
    ("engine", "max_num_batched_tokens"): Field(
        "int", "tokens per scheduler step (prefill chunk budget)", 16, 1_048_576, default=8192
    ),
    ("engine", "kv_cache_dtype"): Field(
        "choice", "KV cache element type", choices=KV_CACHE_DTYPES, default="auto"
    ),
    ("engine", "quantization"): Field(
        "choice",
        "weight quantization; auto = what the checkpoint says",
        choices=QUANTIZATIONS,
        default="auto",
    ),
    ("engine", "weights_bits"): Field(
        "int_or_auto", "plan a checkpoint of this many bits per weight (4, 8, 16)", 4, 16, default="auto"
    ),
    ("engine", "dtype"): Field(
        "choice", "activation dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto"
    ),
    ("engine", "enforce_eager"): Field("bool", "no CUDA graphs and no torch.compile", default=False),
    ("engine", "enable_prefix_caching"): Field(
        "bool", "reuse KV blocks of shared prompt prefixes", default=True
    ),
    ("engine", "enable_chunked_prefill"): Field(
        "bool", "split long prefills into max_num_batched_tokens chunks", default=True
    ),
    # -- layout ----------------------------------------------------------------------------
    ("layout", "strategy"): Field(
        "choice", "how GPUs are split into instances", choices=LAYOUTS, default="auto"
    ),
    ("layout", "tensor_parallel_size"): Field(
        "int_or_auto", "GPUs per instance (tensor parallel)", 1, 64, default="auto"
    ),
    ("layout", "pipeline_parallel_size"): Field("int", "pipeline stages per instance", 1, 64, default=1),
    ("layout", "max_pcie_tensor_parallel"): Field(
        "int", "largest TP group without NVLink (vLLM's custom all-reduce stops past 2)", 1, 64, default=2
    ),
    ("layout", "replicas"): Field(
        "int_or_auto", "independent instances (data-parallel replicas)", 1, 64, default="auto"
    ),
    ("layout", "numa_bind"): Field(
        "bool", "bind each instance's CPUs and memory to its GPUs' NUMA node", default=True
    ),
    # -- speculative decoding --------------------------------------------------------------
    ("speculative", "method"): Field(
        "choice", "speculative decoding method", choices=SPEC_METHODS, default="auto"
    ),
    ("speculative", "draft"): Field(
        "str",
        "draft model: a local directory, a Hugging Face name, or a catalog name",
        nullable=True,
        default=None,
    ),
    ("speculative", "draft_params_b"): Field(
        "float", "preferred draft size in billions of parameters (catalog pick)", 0.01, 100, default=1.5
    ),
    ("speculative", "num_speculative_tokens"): Field("int", "tokens proposed per step (k)", 1, 16, default=5),
    ("speculative", "by_batch_size"): Field(
        "k_table",
        "k by running batch size: [[lo, hi, k], ...] (hi null = no limit)",
        nullable=True,
        default=None,
    ),
    ("speculative", "prompt_lookup_max"): Field("int", "ngram: longest n-gram to match", 1, 64, default=4),
    ("speculative", "prompt_lookup_min"): Field("int", "ngram: shortest n-gram to match", 1, 64, default=2),
    ("speculative", "assumed_acceptance"): Field(
        "float", "per-token acceptance assumed for the estimate", 0.0, 0.999, default=0.6
    ),
    # -- memory model ----------------------------------------------------------------------
    ("memory", "cuda_context_bytes"): Field(
        "size", "per-GPU memory outside torch (CUDA context, NCCL, cuBLAS)", default=768 * MiB
    ),
    ("memory", "cuda_graph_bytes"): Field(
        "size", "per-GPU memory for captured CUDA graphs (0 when eager)", default=512 * MiB
    ),
    ("memory", "margin_bytes"): Field("size", "per-GPU safety margin kept free", default=256 * MiB),
    ("memory", "activation_factor"): Field(
        "float", "multiplier on the estimated activation peak", 0.1, 10, default=1.0
    ),
    # -- server ----------------------------------------------------------------------------
    ("server", "host"): Field(
        "str",
        "address to bind (default loopback)",
        default="127.0.0.1",
        pattern=r"\S+",
        pattern_doc="an address or host name without spaces (0.0.0.0 for every interface)",
    ),
    ("server", "port"): Field(
        "int", "first instance's port; later instances count up", 1, 65_535, default=8000
    ),
    ("server", "served_model_name"): Field("str", "model name clients ask for", nullable=True, default=None),
    ("server", "api_key_env"): Field(
        "str",
        "environment variable holding the API key (never on argv)",
        nullable=True,
        default=None,
        pattern=ENV_NAME,
        pattern_doc="an environment variable name: letters, digits and _, not starting with a digit",
    ),
    ("server", "shutdown_timeout"): Field(
        "int", "seconds vLLM drains in-flight requests on SIGTERM", 0, 3600, default=10
    ),
    ("server", "vllm_command"): Field(
        "str", "the vllm executable (default: next to this Python, else on PATH)", nullable=True, default=None
    ),
    ("server", "user"): Field(
        "str", "systemd unit user (default: a dynamic user)", nullable=True, default=None
    ),
    ("server", "metrics"): Field(
        "bool", "keep vLLM's /metrics series (hwprofile watches them)", default=True
    ),
    ("server", "extra_args"): Field(
        "str_list", "extra vLLM flags appended as given (they bypass the plan: use sparingly)", default=()
    ),
    # -- logs and supervision --------------------------------------------------------------
    ("logs", "dir"): Field(
        "str",
        "per-instance log directories go under this (default: tmpfs /dev/shm/hwprofile)",
        nullable=True,
        default=None,
    ),
    ("logs", "max_bytes"): Field(
        "size", "cap on each instance's logs (tmpfs is RAM); oldest file dropped first", default=64 * MiB
    ),
    ("logs", "files"): Field(
        "int", "log files kept per instance (the cap is split among them)", 2, 100, default=4
    ),
    ("supervise", "ready_timeout"): Field(
        "float", "seconds to wait for /health before a start counts as failed", 5, 86400, default=900.0
    ),
    ("supervise", "max_restarts"): Field(
        "int", "restarts after failures before giving up", 0, 1000, default=5
    ),
    ("supervise", "backoff_initial"): Field(
        "float", "first restart delay in seconds (doubles each time)", 0.1, 3600, default=2.0
    ),
    ("supervise", "backoff_max"): Field(
        "float", "longest restart delay in seconds", 0.1, 86400, default=60.0
    ),
    # -- the daemon: watching and acting ---------------------------------------------------
    ("watch", "interval"): Field("float", "seconds between telemetry samples", 0.1, 60, default=1.0),
    ("watch", "window_s"): Field(
        "float", "window of counter rates, acceptance and latency quantiles (seconds)", 5, 3600, default=60.0
    ),
    ("watch", "warm_c"): Field(
        "float", "GPU temperature at which a card is warm (°C)", 20, 120, default=75.0
    ),
    ("watch", "hot_c"): Field(
        "float", "GPU temperature at which a card is hot: its instances degrade (°C)", 20, 120, default=83.0
    ),
    ("watch", "critical_c"): Field(
        "float", "GPU temperature at which a card is critical: a deeper degrade (°C)", 20, 125, default=88.0
    ),
    ("watch", "warm_margin_c"): Field(
        "float", "warm when the card is this close to its own slowdown threshold (°C)", 0, 60, default=12.0
    ),
    ("watch", "hot_margin_c"): Field(
        "float", "hot when the card is this close to its own slowdown threshold (°C)", 0, 60, default=6.0
    ),
    ("watch", "critical_margin_c"): Field(
        "float", "critical when the card is this close to its own slowdown threshold (°C)", 0, 60, default=2.0
    ),
    ("watch", "hysteresis_c"): Field(
        "float", "degrees below a threshold before a state is left (°C)", 0, 30, default=3.0
    ),
    ("watch", "dwell_s"): Field(
        "float",
        "seconds a new thermal state must hold before it counts (one spike never acts)",
        0,
        600,
        default=3.0,
    ),
    ("watch", "throttle_s"): Field(
        "float",
        "seconds of thermal clock-event reasons that count as hot whatever the temperature",
        0,
        600,
        default=5.0,
    ),
    ("watch", "recover_s"): Field(
        "float",
        "seconds below hot minus the hysteresis before the full profile comes back",
        0,
        86400,
        default=300.0,
    ),
    ("watch", "max_actions_per_hour"): Field(
        "int", "restarts for degrade or recover per instance and hour", 0, 3600, default=6
    ),
    ("watch", "acceptance_low"): Field(
        "float", "speculative acceptance rate below which the daemon warns", 0, 1, default=0.65
    ),
    ("watch", "acceptance_high"): Field(
        "float",
        "speculative acceptance rate above which the daemon says more proposals may pay",
        0,
        1,
        default=0.85,
    ),
    ("watch", "min_draft_tokens"): Field(
        "int", "draft tokens in the window before acceptance is judged", 1, 10**9, default=200
    ),
    ("watch", "apply_k_advice"): Field(
        "bool", "use the advised k at the next restart (otherwise advice only)", default=False
    ),
    ("watch", "metrics_port"): Field(
        "int", "port of hwprofile's own Prometheus metrics on 127.0.0.1 (0: off)", 0, 65535, default=9464
    ),
    ("degrade", "max_num_seqs_factor"): Field(
        "float", "max_num_seqs multiplied by this per degrade step (seed: 256 -> 192)", 0.05, 1, default=0.75
    ),
    ("degrade", "max_num_batched_tokens_factor"): Field(
        "float", "max_num_batched_tokens multiplied by this per degrade step", 0.05, 1, default=0.75
    ),
    ("degrade", "num_speculative_tokens_step"): Field(
        "int", "proposals per step taken off per degrade step (never below 1)", 0, 16, default=1
    ),
    # -- proving a profile: hwprofile bench and verify ------------------------------------
    ("bench", "concurrency"): Field(
        "int", "concurrent requests of the seed workload (seed: 16)", 1, 65_536, default=16
    ),
    ("bench", "input_len"): Field("int", "prompt tokens per request of the seed workload", 1, 1_048_576, default=512),
    ("bench", "output_len"): Field("int", "output tokens per request of the seed workload", 1, 1_048_576, default=256),
    ("bench", "num_prompts"): Field(
        "int", "requests per benchmark point (at least the concurrency is sent)", 1, 10**6, default=64
    ),
    ("bench", "sweep_max"): Field(
        "int", "highest concurrency of the saturation sweep (powers of two from 1)", 1, 65_536, default=64
    ),
    ("bench", "ttft_p99_target_ms"): Field(
        "float", "p99 time to first token the sweep's knee is judged against (seed: 120 ms)", 1, 10**7, default=120.0
    ),
    ("bench", "rounds"): Field("int", "alternating rounds per plan of --compare", 1, 100, default=3),
    ("verify", "min_similarity"): Field(
        "float", "similarity to the baseline a tuned plan's greedy answers must reach (seed: 0.992)", 0, 1, default=0.992
    ),
    ("verify", "max_tokens"): Field("int", "tokens generated per reference prompt", 1, 65_536, default=128),
    # -- CPU backend -----------------------------------------------------------------------
    ("cpu", "kv_cache_space_gib"): Field(
        "float", "KV cache size on the CPU backend (VLLM_CPU_KVCACHE_SPACE)", 0.01, 4096, default=4.0
    ),
    ("cpu", "omp_threads_bind"): Field("str", "VLLM_CPU_OMP_THREADS_BIND", default="auto"),
    # -- what to run -----------------------------------------------------------------------
    ("model",): Field(
        "str",
        "target model: a local directory, a Hugging Face name, or a catalog name",
        nullable=True,
        default=None,
    ),
    ("profile",): Field("str", "force this profile instead of matching", nullable=True, default=None),
}

# Spellings people use that no vLLM accepts (``--kv-cache-dtype fp16`` is invalid in every release).
ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "int8": "fp8"}

SECTIONS = {p[0] for p in SETTINGS if len(p) > 1}
PROFILE_ONLY = {
    ("description",): Field("text", "what the profile is for"),
    ("extends",): Field("str", "parent profile"),
}
MERGE_KEYS = ("_replace", "_drop")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.I)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}


def parse_size(value: Any) -> int:
    """``123``, ``"600MiB"``, ``"1GiB"``, ``"64M"`` (vLLM's style: M = 10^6, MiB = 2^20) → bytes,
    at most ``MAX_SIZE``."""
    if isinstance(value, bool):
        raise ValueError("a size, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        size = value
    else:
        m = _SIZE.match(str(value)) if isinstance(value, str | float) else None
        if not m:
            raise ValueError(f"{value!r} is not a size (use bytes or e.g. 600MiB, 1GiB)")
        number, unit = float(m.group(1)), (m.group(2) or "").upper()
        binary = "I" in unit
        base = unit[:1] if unit[:1] in "KMGT" and unit else ""
        factor = 1024 ** ("KMGT".index(base) + 1) if binary and base else _UNITS[base]
        if not math.isfinite(number * factor):
            raise ValueError(f"{value!r} is too large a size (at most {MAX_SIZE} bytes)")
        size = int(number * factor)
    if size > MAX_SIZE:
        raise ValueError(f"{value!r} is too large a size (at most {MAX_SIZE} bytes, 1 PiB)")
    return size


def _check(field: Field, value: Any) -> Any:
    """Return the value converted to its kind, or raise ValueError saying what is expected."""
    if value is None:
        if field.nullable:
            return None
        raise ValueError("a value is required (null is not allowed here)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    k = field.kind
    if k == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise ValueError(f"expected true or false, got {value!r}")
    if k in ("int", "float", "int_or_auto"):
        if k == "int_or_auto" and value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int | float):
            if not isinstance(value, str):
                value = repr(value)  # a list or mapping: refused below, with what was given
            try:
                value = float(value) if k == "float" else int(str(value), 10)
            except ValueError:
                expected = (
                    "a number"
                    if k == "float"
                    else ("an integer or auto" if k == "int_or_auto" else "an integer")
                )
                raise ValueError(f"expected {expected}, got {value!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value}")
        if k != "float":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        if isinstance(value, int) and value.bit_length() > 63:
            raise ValueError(
                f"a {value.bit_length()}-bit number is out of range [{_num(field.lo)}, {_num(field.hi)}]"
            )
        if (field.lo is not None and value < field.lo) or (field.hi is not None and value > field.hi):
            raise ValueError(f"{value} is out of range [{_num(field.lo)}, {_num(field.hi)}]")
        return value
    if k == "choice":
        if value not in field.choices:
            alias = ALIASES.get(str(value).lower())
            close = [alias] if alias in field.choices else _close(str(value), field.choices)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{value!r} is not one of: {', '.join(field.choices)}{hint}")
        return value
    if k in ("str", "text"):
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"expected text, got {type(value).__name__}")
        text = str(value)
        if k == "text":  # several lines allowed, but no escape sequences for the terminal
            plain_text(text.replace("\n", " ").replace("\t", " "))
            return text
        plain_text(text)
        if field.pattern and not re.fullmatch(field.pattern, text):
            raise ValueError(f"{text!r} is not {field.pattern_doc}")
        return text
    if k == "size":
        return parse_size(value)
    if k == "k_table":
        return _k_table(value)
    if k == "str_list":
        if isinstance(value, str):
            import shlex

            plain_text(value)
            return shlex.split(value)
        if not isinstance(value, list) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
        ):
            raise ValueError("expected a list of strings")
        items = [str(v) for v in value]
        for item in items:
            plain_text(item)
        return items
    raise AssertionError(k)


CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def plain_text(text: str) -> None:
    """Refuse control characters (newline, tab, escape, NUL, ...): they would break, or add lines
    to, the shell line, the environment file or the systemd unit this text reaches."""
    m = CONTROL_CHARS.search(text)
    if m:
        raise ValueError(
            f"{text!r} holds the control character {m.group()!r} at position {m.start()}; "
            "text settings are one line of printable characters"
        )


def _num(x: float | None) -> str:
    return "-inf" if x is None else (str(int(x)) if float(x).is_integer() else str(x))


def _k_table(value: Any) -> list[list[int | None]]:
    if not isinstance(value, list) or not value:
        raise ValueError("expected a list of [lo, hi, k] rows")
    rows: list[list[int | None]] = []
    for row in value:
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError(f"row {row!r} is not [lo, hi, k]")
        lo, hi, k = row
        if any(isinstance(x, bool) for x in row):
            raise ValueError(f"row {row!r}: numbers, not booleans")
        if not isinstance(lo, int) or lo < 1 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
            raise ValueError(f"row {row!r}: need 1 <= lo <= hi (hi may be null)")
        if not isinstance(k, int) or not 0 <= k <= 16:
            raise ValueError(f"row {row!r}: k must be an integer 0..16")
        rows.append([lo, hi, k])
    rows.sort(key=lambda r: r[0])
    if rows[0][0] != 1:
        raise ValueError("the first row must start at batch size 1 (vLLM needs a k for every batch size)")
    for a, b in itertools.pairwise(rows):
        if a[1] is None or a[1] >= b[0]:
            raise ValueError(f"rows {a} and {b} overlap")
    return rows


def _close(word: str, valid: Iterable[str]) -> list[str]:
    import difflib  # only on the error path: its import is a cost every start would pay

    return difflib.get_close_matches(word, list(valid), n=1, cutoff=0.6)


def suggest(key: str, valid: list[str]) -> str:
    close = _close(key, valid)
    return f" (did you mean '{close[0]}'?)" if close else ""


def validate(
    data: Any,
    where: Callable[[tuple[str, ...]], Source],
    allowed_top: dict[tuple[str, ...], Field] | None = None,
) -> dict[str, Any]:
    """Check a settings tree (one layer); return it with values converted. Raises ConfigError
    listing every problem, each with its file and line, and the valid choices."""
    fields = {**SETTINGS, **(allowed_top or {})}
    problems: list[str] = []
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_loc(where(()))}: expected a mapping of settings, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                problems.append(f"{_loc(where((key,)))}: '{key}' must be a mapping of settings")
                continue
            section: dict[str, Any] = {}
            valid = sorted(p[1] for p in fields if len(p) == 2 and p[0] == key)
            for sub, v in value.items():
                sub = str(sub)
                path = (key, sub)
                if sub in MERGE_KEYS:
                    try:
                        section[sub] = _merge_key(sub, v, valid)
                    except ValueError as e:
                        problems.append(f"{_loc(where(path))}: {key}.{sub}: {e}")
                    continue
                f = fields.get(path)
                if f is None:
                    problems.append(
                        f"{_loc(where(path))}: unknown key '{key}.{sub}'{suggest(sub, valid)}; "
                        f"valid keys in '{key}': {', '.join(valid)}"
                    )
                    continue
                try:
                    section[sub] = _check(f, v)
                except (ValueError, TypeError) as e:
                    problems.append(f"{_loc(where(path))}: {key}.{sub}: {e}")
            out[key] = section
            continue
        f = fields.get((key,))
        if f is None:
            valid = sorted({p[0] for p in fields})
            problems.append(
                f"{_loc(where((key,)))}: unknown key '{key}'{suggest(key, valid)}; valid top-level keys: {', '.join(valid)}"
            )
            continue
        try:
            out[key] = _check(f, value)
        except (ValueError, TypeError) as e:
            problems.append(f"{_loc(where((key,)))}: {key}: {e}")
    if problems:
        raise ConfigError(problems)
    return out


def _merge_key(name: str, value: Any, valid: list[str]) -> Any:
    """``_replace`` must be a real boolean (``"no"`` is text, and text is true); ``_drop`` a list
    of the section's keys."""
    if name == "_replace":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false (unquoted), got {value!r}")
        return value
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"expected a list of keys to remove, e.g. [{valid[0]}], got {value!r}")
    unknown = [x for x in items if x not in valid]
    if unknown:
        raise ValueError(
            f"cannot drop unknown key '{unknown[0]}'{suggest(unknown[0], valid)}; valid keys: {', '.join(valid)}"
        )
    return list(items)


def defaults() -> dict[str, Any]:
    """Every setting at its schema default, as a settings tree (a fresh copy)."""
    out: dict[str, Any] = {}
    for path, f in SETTINGS.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = list(f.default) if isinstance(f.default, tuple) else f.default
    return out


def with_defaults(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """``settings`` with every setting the layers left unset at its schema default, and the paths
    so filled. The result always carries every setting: readers need no fallback."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in settings.items()}
    filled: list[tuple[str, ...]] = []
    for path, f in SETTINGS.items():
        node = out
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if path[-1] not in node:
            node[path[-1]] = list(f.default) if isinstance(f.default, tuple) else f.default
            filled.append(path)
    return out, filled


def _loc(s: Source) -> str:
    if s.file and s.line:
        return f"{s.file}:{s.line}"
    return s.file or s.kind


def resolve_key(dotted: str) -> tuple[str, ...]:
    """``engine.max_model_len`` or a unique leaf name like ``max_model_len`` → the setting's path."""
    parts = tuple(p for p in dotted.strip().split(".") if p)
    if parts in SETTINGS:
        return parts
    if len(parts) == 1:
        leaves = [p for p in SETTINGS if p[-1] == parts[0]]
        if len(leaves) == 1:
            return leaves[0]
    valid = [".".join(p) for p in SETTINGS]
    raise ValueError(f"unknown setting '{dotted}'{suggest(dotted, valid)}")
