"""Issue 34's typed seams in the planner: the typed ABSENT sentinel (a value the type checker makes
every reader test for) and the planning context (one object carrying the inputs and the reasons and
warnings every step records into)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hwprofile.config import Source
from hwprofile.config.settings import Settings
from hwprofile.plan.context import PlanContext
from hwprofile.plan.reasons import Reasons
from hwprofile.plan.types import ABSENT, Absent, InstancePlan

ROOT = Path(__file__).resolve().parent.parent


def test_absent_is_one_falsy_member_that_survives_copies_and_pickles() -> None:
    assert ABSENT is Absent.ABSENT and not ABSENT and repr(ABSENT) == "ABSENT"
    assert copy.copy(ABSENT) is ABSENT and copy.deepcopy(ABSENT) is ABSENT
    assert pickle.loads(pickle.dumps(ABSENT)) is ABSENT
    assert (ABSENT or None) is None  # the `x or default` reads of the renderer rely on it


def _mypy(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "reader.py"
    src.write_text("from hwprofile.plan.types import ABSENT, InstancePlan\n\n" + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(src)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("def nodes(i: InstancePlan) -> int:\n    return i.nnodes + 1\n", "Literal[Absent.ABSENT]"),
        ("def nodes(i: InstancePlan) -> int:\n    return 1 if i.nnodes is ABSENT else i.nnodes + 1\n", None),
        ("def ids(i: InstancePlan) -> int:\n    return len(i.gpu_uuids)\n", "Literal[Absent.ABSENT]"),
        ("def ids(i: InstancePlan) -> int:\n    return len(i.gpu_uuids or ())\n", None),
    ],
)
def test_the_type_checker_makes_a_reader_test_for_absent(
    tmp_path: Path, body: str, error: str | None
) -> None:
    """A field that may be absent says so in its type: reading it as its value without a test is a
    type error; with one (``is ABSENT``, or ``or`` since ABSENT is false) it is not."""
    r = _mypy(tmp_path, body)
    if error is None:
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        assert r.returncode == 1 and error in r.stdout, r.stdout + r.stderr


def test_a_derived_context_records_into_the_same_reasons_and_warnings(host_of) -> None:
    host = host_of("rtx3090-1x")
    other = host_of("a100-80g-pcie-1x")
    ctx = PlanContext(host, Settings(), Reasons({("engine", "max_num_seqs"): Source("cli")}))
    assert ctx.version == host.software.vllm_version and ctx.release.target == ctx.version
    node = ctx.on(host=other)
    assert node.host is other and node.settings is ctx.settings
    assert node.reasons is ctx.reasons and node.warnings is ctx.warnings
    assert node.add("instances[0].engine.max_num_seqs", 8, "why", ("engine", "max_num_seqs")) == 8
    node.warn("a warning")
    ctx.add("x", 1, "planner's own")
    assert [(i.key, i.source) for i in ctx.reasons.items] == [
        ("instances[0].engine.max_num_seqs", "cli"),
        ("x", "planner"),
    ]
    assert ctx.warnings == ["a warning"]
    tighter = ctx.on(settings=Settings())
    assert tighter.host is host and tighter.settings is not ctx.settings and tighter.warnings is ctx.warnings


def test_instance_plan_fields_that_may_be_absent_default_to_it() -> None:
    names = {
        f.name
        for f in InstancePlan.__dataclass_fields__.values()
        if f.default is ABSENT  # every one typed `... | AbsentT`
    }
    assert {"gpu_uuids", "nnodes", "node_rank", "prediction", "interconnect"} <= names
    hints = InstancePlan.__annotations__
    assert all("AbsentT" in str(hints[n]) for n in names), {n: hints[n] for n in names}
