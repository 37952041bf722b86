"""One source of defaults (the schema), explicit zeros honoured, and the planner reading settings
without fallbacks of its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hwprofile.config import ConfigError
from hwprofile.config.fields import check
from hwprofile.config.schema import SETTINGS, defaults, validate
from hwprofile.config.settings import SECTIONS, Settings
from hwprofile.config.yamlsrc import load_file, source_of
from hwprofile.match.profiles import builtin_dir
from hwprofile.pipeline import make_plan
from hwprofile.plan.memory import MiB

MODEL = "Qwen/Qwen3-8B"  # a catalog model that fits a 24 GB card at 16 bits


def _plan(host: Any, root: Path, *sets: str, profile: str | None = None) -> dict[str, Any]:
    """The plan's JSON (``plan --json``)."""
    return make_plan(host, root, profile=profile, sets=list(sets), model=MODEL, environ={}).to_json()


def _reason(plan: dict[str, Any], key: str) -> dict[str, Any]:
    return next(r for r in plan["reasons"] if r["key"] == key)


# -- the schema's default is the only default ---------------------------------------------------


def test_every_setting_has_a_valid_default() -> None:
    tree = defaults()
    for path, field in SETTINGS.items():
        node: Any = tree
        for p in path:
            node = node[p]
        if node is not None or not field.nullable:
            assert check(field, node) == node, path


def test_base_profile_agrees_with_the_schema() -> None:
    """base.yaml may spell a default out, but never a different one."""
    path = f"{builtin_dir()}/base.yaml"
    data, locs = load_file(path)
    data = {k: v for k, v in data.items() if k not in ("description", "extends")}
    base = validate(data, lambda p: source_of("builtin", path, locs, p))
    for section, values in base.items():
        items = values.items() if isinstance(values, dict) else [(None, values)]
        for key, value in items:
            setting = (section,) if key is None else (section, key)
            want = SETTINGS[setting].default
            want = list(want) if isinstance(want, tuple) else want
            assert value == want, (setting, value, want)


@pytest.mark.parametrize(
    ("setting", "value"),
    [  # the values code and profiles used to disagree on
        (("engine", "max_num_seqs"), 256),  # code: `or 64` (GPU), `or 4` (CPU)
        (("speculative", "num_speculative_tokens"), 5),  # code: `or 3`
        (("supervise", "ready_timeout"), 900.0),  # repeated in the launcher and the supervisor
        (("engine", "max_num_batched_tokens"), 8192),  # code: `or 2048`
        (("engine", "max_model_len"), 8192),  # code: `or 8192` (GPU), `or 2048` (CPU)
        (("server", "shutdown_timeout"), 10),  # code: `or 0`
        (("memory", "margin_bytes"), 256 * MiB),
    ],
)
def test_previously_contradicting_defaults_have_one_value(
    host_of: Any, empty_root: Path, setting: tuple[str, ...], value: Any
) -> None:
    assert SETTINGS[setting].default == value
    # A profile that sets nothing (not even through base) plans with exactly that value.
    (empty_root / "profiles").mkdir(exist_ok=True)
    (empty_root / "profiles" / "bare.yaml").write_text("description: sets nothing\n")
    # four requests in flight: at the default sixteen the 1.7B draft would leave them waiting for KV on
    # the 24 GB card and give way to no speculation (tests/test_draft_gives_way.py)
    few = ("layout.workload_concurrency=4",) if setting == ("speculative", "num_speculative_tokens") else ()
    plan = _plan(host_of("rtx4090-1x"), empty_root, *few, profile="bare")
    inst = plan["instances"][0]
    planned = {
        ("engine", "max_num_seqs"): inst["engine"]["max_num_seqs"],
        ("speculative", "num_speculative_tokens"): (inst["speculative"] or {}).get("num_speculative_tokens"),
        ("supervise", "ready_timeout"): plan["supervise"].get("ready_timeout"),
        ("engine", "max_num_batched_tokens"): inst["engine"]["max_num_batched_tokens"],
        ("engine", "max_model_len"): _reason(plan, "instances[0].engine.max_model_len")["value"],
        ("server", "shutdown_timeout"): inst["server"]["shutdown_timeout"],
        ("memory", "margin_bytes"): inst["memory"]["overhead_bytes"] - 128 * MiB - 512 * MiB,
    }
    if setting == ("engine", "max_model_len"):  # shortened to what fits, never past the default
        assert planned[setting] <= value
    else:
        assert planned[setting] == value, (setting, planned[setting])


def test_dropped_setting_falls_back_to_the_schema_default(host_of: Any, empty_root: Path) -> None:
    (empty_root / "overrides.d").mkdir()
    (empty_root / "overrides.d" / "a.yaml").write_text("engine:\n  _drop: [max_num_seqs]\n")
    plan = _plan(host_of("rtx4090-1x"), empty_root)
    assert plan["instances"][0]["engine"]["max_num_seqs"] == 256  # not the planner's old `or 64`
    assert _reason(plan, "instances[0].engine.max_num_seqs")["source"] == "default schema"


def test_typed_settings_fill_only_what_is_missing() -> None:
    settings, paths = Settings.from_tree({"engine": {"max_num_seqs": 3}, "memory": {"margin_bytes": 0}})
    assert settings.engine.max_num_seqs == 3 and ("engine", "max_num_seqs") not in paths
    assert settings.memory.margin_bytes == 0 and ("memory", "margin_bytes") not in paths  # 0 stays 0
    assert settings.supervise.ready_timeout == 900.0 and ("supervise", "ready_timeout") in paths
    assert len(paths) == len(SETTINGS) - 2


def test_the_table_of_settings_is_the_typed_declarations() -> None:
    """One declaration per setting: the table validation uses is derived from the dataclasses."""
    typed = Settings()
    for path, field in SETTINGS.items():
        value: Any = typed
        for part in path:
            value = getattr(value, part)
        want = field.default
        assert value == want, path
    assert set(SECTIONS) == {p[0] for p in SETTINGS if len(p) == 2}


def test_typed_settings_check_what_they_are_built_from() -> None:
    with pytest.raises(ConfigError, match=r"engine.max_num_seqs: 0 is out of range"):
        Settings.from_tree({"engine": {"max_num_seqs": 0}})
    assert Settings.from_tree({"server": {"extra_args": ["--a", "1"]}})[0].server.extra_args == ("--a", "1")


def test_sections_are_frozen_values() -> None:
    import dataclasses

    from hwprofile.config.settings import Watch

    w = Watch(hot_c=80.0)
    assert (w.hot_c, w.warm_c) == (80.0, SETTINGS[("watch", "warm_c")].default)  # the rest at its default
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.hot_c = 90.0  # type: ignore[misc]
    cooler = dataclasses.replace(w, hot_c=78.0)
    assert cooler.hot_c == 78.0 and w.hot_c == 80.0 and cooler != w and w == Watch(hot_c=80.0)
    assert hash(w) == hash(Watch(hot_c=80.0)) and w.to_json()["hot_c"] == 80.0
    with pytest.raises(TypeError, match="hot"):
        Watch(hot=1)  # type: ignore[call-arg]


# Fallbacks of their own (`x or 64`, `.get("ready_timeout", 900)`) in the code that reads settings.
_KEYS = "|".join(sorted({p[-1] for p in SETTINGS}))
_FALLBACK = re.compile(r"settings\.\w+(?:\.\w+)*\s+or\s+\S|\.get\(\s*[\"'](?:" + _KEYS + r")[\"']\s*,")


def test_code_reads_settings_without_fallbacks() -> None:
    pkg = Path(__file__).parents[1] / "hwprofile"
    files = [
        *pkg.glob("plan/*.py"),
        *pkg.glob("launch/*.py"),
        *pkg.glob("cli/*.py"),
        *pkg.glob("daemon/*.py"),
        pkg / "pipeline.py",
    ]
    found = [f"{f.name}: {m.group()}" for f in files for m in _FALLBACK.finditer(f.read_text())]
    assert found == []
    assert _FALLBACK.search('timeout = float(plan.supervise.get("ready_timeout", 900))')  # what it finds
    assert _FALLBACK.search("seqs = settings.engine.max_num_seqs or 64")


# -- an explicit zero is honoured (or refused by the schema's range) ------------------------------


def test_margin_zero_plans_a_zero_margin(host_of: Any, empty_root: Path) -> None:
    host = host_of("rtx4090-1x")
    default = _plan(host, empty_root)
    zero = _plan(host, empty_root, "memory.margin_bytes=0")
    d, z = default["instances"][0]["memory"], zero["instances"][0]["memory"]
    assert d["overhead_bytes"] - z["overhead_bytes"] == 256 * MiB
    assert z["overhead_bytes"] == 128 * MiB + 512 * MiB  # outside PyTorch + graphs, no margin
    assert z["kv_cache_bytes"] - d["kv_cache_bytes"] == 256 * MiB
    assert zero["provenance"]["memory.margin_bytes"] == "cli --set memory.margin_bytes=0"


@pytest.mark.parametrize(
    ("assignment", "check"),
    [
        ("memory.cuda_graph_bytes=0", lambda p: p["instances"][0]["memory"]["overhead_bytes"] == 384 * MiB),
        ("memory.non_torch_bytes=0", lambda p: p["instances"][0]["memory"]["overhead_bytes"] == 768 * MiB),
        ("server.shutdown_timeout=0", lambda p: p["instances"][0]["server"]["shutdown_timeout"] == 0),
        (
            "speculative.assumed_acceptance=0",
            lambda p: p["instances"][0]["estimate"].get("assumed_acceptance") == 0.0,
        ),
    ],
)
def test_explicit_zero_is_honoured(host_of: Any, empty_root: Path, assignment: str, check: Any) -> None:
    plan = _plan(host_of("rtx4090-1x"), empty_root, assignment, "speculative.method=ngram")
    assert check(plan), plan["instances"][0]


@pytest.mark.parametrize(
    "assignment",
    [
        "engine.max_num_seqs=0",
        "engine.max_model_len=0",
        "engine.gpu_memory_utilization=0",
        "speculative.num_speculative_tokens=0",
        "cpu.kv_cache_space_gib=0",
        "layout.pipeline_parallel_size=0",
        "logs.files=0",
    ],
)
def test_zero_where_it_is_not_valid_is_refused(host_of: Any, empty_root: Path, assignment: str) -> None:
    with pytest.raises(ConfigError, match=r"is out of range"):
        _plan(host_of("rtx4090-1x"), empty_root, assignment)


def test_consecutive_ports_must_stay_ports(host_of: Any, empty_root: Path) -> None:
    host = host_of("a800-pcie-4x-2numa")
    two = "layout.tensor_parallel_size=2"  # two servers, one per NUMA pair (the operator's layout stays)
    plan = _plan(host, empty_root, "server.port=65534", two)
    ports = [i["server"]["port"] for i in plan["instances"]]
    assert ports == list(range(65534, 65534 + len(ports))) and ports[-1] <= 65535
    with pytest.raises(ConfigError, match=r"server.port 65535 \(cli --set server.port=65535\): 2 instances"):
        _plan(host, empty_root, "server.port=65535", two)
