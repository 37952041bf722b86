"""Hostile host snapshots (``--from FILE``): one clear error naming the JSON path, exit 2, nothing
printed on stdout, never a traceback, a hang or a plan.

The corpus is ``tests/hostile/snapshots.json``: each case edits the valid ``host-base.json`` (``ops``),
or replaces it (``text``), or is built here (``gen``: files too big, too deep or not UTF-8 to keep
in the corpus); ``expect`` is a part of the error message; ``schema: false`` marks what only the
loader can catch (cross-field rules, the file itself), everything else the published JSON Schema
(``schemas/hwprofile.host-1.schema.json``) rejects too.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import inproc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwprofile.host.snapshot import MAX_SNAPSHOT_BYTES, HostSnapshot, SnapshotError
from hwprofile.host.snapshot_io import load_snapshot, snapshot_from_dict
from hwprofile.host.snapshot_schema import json_schema

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "hostile"
SCHEMA_FILE = HERE.parent / "schemas" / "hwprofile.host-1.schema.json"
BASE: dict[str, Any] = json.loads((HOSTILE / "host-base.json").read_text())
CASES: list[dict[str, Any]] = json.loads((HOSTILE / "snapshots.json").read_text())


def _walk(doc: Any, path: str) -> tuple[Any, str | int]:
    *parents, last = path.split(".")
    for p in parents:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, int(last) if isinstance(doc, list) else last


def apply_ops(ops: list[list[Any]], base: dict[str, Any] = BASE) -> dict[str, Any]:
    """``["set", "gpus.0.lost", v]``, ``["del", "gpus.0.index"]``, ``["append", "errors", v]``."""
    doc = copy.deepcopy(base)
    for op, path, *value in ops:
        parent, key = _walk(doc, path)
        if op == "set":
            parent[key] = value[0]
        elif op == "del":
            del parent[key]
        else:
            parent[key].append(value[0])
    return doc


def _generated(kind: str) -> bytes:
    text = json.dumps(BASE, indent=2)
    if kind == "latin1":
        return text.replace('"hostname": "', '"hostname": "caf\u00e9-', 1).encode("latin-1")
    if kind == "utf16":
        return text.encode("utf-16")
    if kind == "deep-unknown":
        return (text[:-2] + ', "x-extra": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    if kind == "deep-top":
        return b"[" * 100_000 + b"]" * 100_000
    if kind == "too-large":
        return (text[:-1] + " " * (MAX_SNAPSHOT_BYTES + 1) + "}").encode()
    if kind == "nan":
        return text.replace('"power_draw_watts": 60.0', '"power_draw_watts": NaN', 1).encode()
    if kind == "infinity":
        return text.replace('"memory_bytes": ', '"memory_bytes": Infinity, "x": ', 1).encode()
    if kind == "duplicate-key":
        return text.replace('"lost": false', '"lost": false, "lost": true', 1).encode()
    if kind == "bigint":
        return text.replace('"memory_bytes": ', '"memory_bytes": ' + "9" * 5000 + ', "x": ', 1).encode()
    if kind == "many-gpus":
        gpus = [{**BASE["gpus"][0], "index": i} for i in range(257)]
        return json.dumps({**BASE, "gpus": gpus, "gpu_links": []}).encode()
    raise AssertionError(kind)


def case_bytes(case: dict[str, Any]) -> bytes:
    if "ops" in case:
        return json.dumps(apply_ops(case["ops"])).encode()
    if "text" in case:
        return case["text"].encode()
    return _generated(case["gen"])


def _cli(
    args: list[str], env: dict[str, str], stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", *args], env=env, input=stdin, capture_output=True, timeout=60
    )
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


@pytest.fixture
def env(empty_root: Path) -> dict[str, str]:
    return {**os.environ, "HWPROFILE_CONFIG_ROOT": str(empty_root)}


def test_corpus_is_large_and_named() -> None:
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)
    assert all(c["expect"] and c["why"] for c in CASES)


def test_base_snapshot_plans(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(BASE))
    r = _cli(["plan", "--from", str(path), "--json"], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["instances"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hostile_snapshot_is_one_clear_error(
    case: dict[str, Any], env: dict[str, str], tmp_path: Path
) -> None:
    if case.get("gen") == "directory":
        source, stdin = str(tmp_path), None
    elif case.get("stdin"):
        source, stdin = "-", case_bytes(case)
    else:
        path = tmp_path / "host.json"
        path.write_bytes(case_bytes(case))
        source, stdin = str(path), None
    r = inproc.hwprofile(["plan", "--from", source, "--json"], env, stdin)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert r.stdout == "", "nothing half-done on stdout"
    assert r.stderr.startswith("hwprofile: error: ") and r.stderr.count("hwprofile: error:") == 1, r.stderr
    assert case["expect"] in r.stderr, r.stderr


@pytest.mark.parametrize("case", CASES[::15], ids=[c["id"] for c in CASES[::15]])
def test_the_in_process_cli_is_the_cli(case: dict[str, Any], env: dict[str, str], tmp_path: Path) -> None:
    """The corpus runs in this process (tests/inproc.py); a sample of it run both ways says the same."""
    if case.get("gen") == "directory":
        source, stdin = str(tmp_path), None
    elif case.get("stdin"):
        source, stdin = "-", case_bytes(case)
    else:
        (tmp_path / "host.json").write_bytes(case_bytes(case))
        source, stdin = str(tmp_path / "host.json"), None
    args = ["plan", "--from", source, "--json"]
    a, b = _cli(args, env, stdin), inproc.hwprofile(args, env, stdin)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


# -- the published JSON Schema -----------------------------------------------------------------


def test_schema_file_is_the_loader_contract() -> None:
    published = json.loads(SCHEMA_FILE.read_text())
    assert published == json_schema(), (
        'regenerate it: python -c "import json, hwprofile.host.snapshot_schema as s; '
        'print(json.dumps(s.json_schema(), indent=2, ensure_ascii=False))" > schemas/hwprofile.host-1.schema.json'
    )
    assert published["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def _validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_detect_output_of_every_fixture_validates(host_of) -> None:
    from fakehost import fixture_names

    validator = _validator()
    for name in fixture_names():
        out = json.loads(host_of(name).to_json())  # exactly what `detect --json` prints
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(out)]
        assert not errors, (name, errors)
        assert snapshot_from_dict(out).to_dict() == out, name


def test_schema_and_loader_agree_on_the_corpus() -> None:
    validator = _validator()
    assert validator.is_valid(BASE)
    for case in CASES:
        if "ops" in case and case.get("schema", True):
            assert not validator.is_valid(apply_ops(case["ops"])), case["id"]


# -- fuzzing, in process -----------------------------------------------------------------------


def _paths(doc: Any, prefix: str = "") -> list[str]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, f"{prefix}.{i}")
    return out


PATHS = _paths(BASE)
SHARP = st.sampled_from(
    [
        -1,
        0,
        1,
        255,
        256,
        2**40,
        2**64,
        -(2**63),
        1.5,
        1e308,
        "",
        "0",
        "false",
        "NV4",
        "8.9",
        "0-3",
        "/x",
        None,
        True,
        False,
    ]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | SHARP,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
EDITS = st.lists(st.tuples(st.sampled_from(PATHS), st.booleans(), JSON_VALUES), min_size=1, max_size=3)


def _mutate(edits: list[tuple[str, bool, Any]]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for path, delete, value in edits:
        try:
            parent, key = _walk(doc, path)
            if delete and isinstance(parent, dict):
                parent.pop(key, None)
            else:
                parent[key] = value
        except (KeyError, IndexError, TypeError, ValueError):
            pass  # an earlier edit removed or replaced the path
    return doc


def _use(host: HostSnapshot) -> None:
    """What the commands do with a loaded snapshot: print it, match it, save and load it again."""
    from hwprofile.cli.views import format_host
    from hwprofile.match.rules import host_facts

    format_host(host).encode("utf-8")
    host_facts(host)
    again = snapshot_from_dict(json.loads(host.to_json()))
    assert again.to_dict() == host.to_dict()


@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(edits=EDITS)
def test_fuzz_from_dict_only_raises_snapshot_error(edits: list[tuple[str, bool, Any]]) -> None:
    doc = _mutate(edits)
    try:
        host = snapshot_from_dict(doc, source="fuzz.json")
    except SnapshotError as e:
        assert str(e).startswith("fuzz.json")
        return
    _use(host)
    for g in host.gpus:  # what the issue saw go wrong
        assert type(g.index) is int and 0 <= g.index < 256 and type(g.lost) is bool
    assert len({g.index for g in host.gpus}) == len(host.gpus)


@settings(max_examples=300, deadline=2000)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda text, at, junk: (text[:at] + junk + text[at:]).encode("utf-8", "surrogatepass"),
            st.just(json.dumps(BASE)),
            st.integers(0, len(json.dumps(BASE))),
            st.text(max_size=4),
        ),
    )
)
def test_fuzz_load_bytes_only_raises_snapshot_error(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(data)
        f.flush()
        try:
            host = load_snapshot(f.name)
        except SnapshotError as e:
            assert str(e).startswith(f.name)
            return
    _use(host)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(edits=EDITS)
def test_fuzz_accepted_snapshots_plan_or_refuse(edits: list[tuple[str, bool, Any]], empty_root: Path) -> None:
    """Whatever the loader accepts, the planner plans or refuses with a reason: no other exception."""
    from hwprofile.pipeline import make_plan
    from hwprofile.plan import PlanRefused

    try:
        host = snapshot_from_dict(_mutate(edits))
    except SnapshotError:
        return
    try:
        plan = make_plan(host, empty_root, model="Qwen/Qwen3-8B", environ={}).to_json()
    except PlanRefused as e:
        assert e.message
        return
    usable = {g.index for g in host.usable_gpus}
    for inst in plan["instances"]:
        assert set(inst["gpus"]) <= usable
        assert len(set(inst["gpus"])) == len(inst["gpus"])
