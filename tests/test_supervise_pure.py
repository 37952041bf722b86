"""Failure classification, the out-of-memory ladder, startup verification, rotating logs, state."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from hwprofile.plan.types import (
    EngineSettings,
    Estimate,
    InstancePlan,
    MemoryFit,
    ServerSettings,
    SpeculativeConfig,
)
from hwprofile.runtime.processes import identify
from hwprofile.supervise.failures import Rung, classify, ladder_sets, next_rung
from hwprofile.supervise.logs import RotatingLog
from hwprofile.supervise.runfiles import RunFileError, SupervisorDoc, read_doc, write_doc
from hwprofile.supervise.verify import compare, parse_startup

LOGS = {
    # real vLLM / PyTorch messages → kind
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": ("out of memory", True),
    "ValueError: Free memory on device cuda:0 (10.1/23.6 GiB) on startup is less than desired GPU memory utilization (0.92, 21.7 GiB).": (
        "free memory below the requested share",
        True,
    ),
    "ValueError: To serve at least one request with the models's max seq len (2048), (0.02 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB).": (
        "no memory left for the KV cache",
        True,
    ),
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`": (
        "no memory left for the KV cache",
        True,
    ),
    "vllm: error: unrecognized arguments: --bogus-flag 3": ("unknown flag", False),
    "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name'": (
        "missing model",
        False,
    ),
    "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use": (
        "port in use",
        False,
    ),
    "ValueError: Head size 48 is not supported by PagedAttention.": ("unsupported head size", False),
    "something nobody has seen before": ("unknown", False),
}


@pytest.mark.parametrize("text", sorted(LOGS))
def test_classify(text: str) -> None:
    f = classify("INFO loading\n" + text + "\nINFO shutting down\n")
    kind, memory = LOGS[text]
    assert (f.kind, f.memory_like) == (kind, memory)
    assert f.retry == (memory or kind == "unknown")
    assert (
        (text[:30] in f.evidence) if kind != "unknown" else f.evidence == "INFO shutting down"
    )  # the last line


def _inst(device: str = "cuda") -> InstancePlan:
    cuda = device == "cuda"
    return InstancePlan(
        name="vllm-gpu0" if cuda else "vllm-cpu",
        device=device,
        gpus=(0,) if cuda else (),
        gpu_name=None,
        numa_node=None,
        cpus=None,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        server=ServerSettings("127.0.0.1", 8000, None, None, 10, None, None, True, ()),
        engine=EngineSettings(
            gpu_memory_utilization=0.6 if cuda else None,
            max_model_len=1024,
            max_num_seqs=4,
            max_num_batched_tokens=2048,
            kv_cache_dtype="auto",
            quantization=None,
            dtype="auto",
            enforce_eager=False,
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
        ),
        speculative=SpeculativeConfig("ngram", None, 3),
        memory=MemoryFit(*[0] * 12),
        estimate=Estimate(),
    )


def _with(inst: InstancePlan, **engine) -> InstancePlan:
    return dataclasses.replace(inst, engine=dataclasses.replace(inst.engine, **engine))


def _apply(inst: InstancePlan, step: Rung) -> InstancePlan:
    """What a re-plan with the step's override gives, for these tests (the planner follows it)."""
    key, _, value = step.set.partition("=")
    section, name = key.split(".")
    if section == "speculative":
        return dataclasses.replace(inst, speculative=None)
    return _with(inst, **{name: True if value == "true" else float(value) if "." in value else int(value)})


def _walk(inst: InstancePlan, min_model_len: int = 256) -> tuple[InstancePlan, list[Rung]]:
    taken: list[Rung] = []
    while (step := next_rung(inst, taken, min_model_len)) is not None:
        inst = _apply(inst, step)
        taken.append(step)
    return inst, taken


def test_ladder_goes_down_one_step_at_a_time_then_stops() -> None:
    original = _inst()
    inst, taken = _walk(original)
    assert [t.rung for t in taken] == [
        "memory share",
        "memory share",
        "context length",
        "context length",
        "concurrent sequences",
        "concurrent sequences",
        "eager mode",
        "speculative decoding",
    ]
    assert [t.set for t in taken] == [
        "engine.gpu_memory_utilization=0.55",
        "engine.gpu_memory_utilization=0.5",
        "engine.max_model_len=512",
        "engine.max_model_len=256",
        "engine.max_num_seqs=2",
        "engine.max_num_seqs=1",
        "engine.enforce_eager=true",
        "speculative.method=none",
    ]
    assert [t.change for t in taken][:3] == [
        "gpu_memory_utilization 0.6 -> 0.55",
        "gpu_memory_utilization 0.55 -> 0.5",
        "max_model_len 1024 -> 512",
    ]
    assert taken[-1].change == "ngram speculation dropped (draft weights and KV freed)"
    assert inst.engine.gpu_memory_utilization == 0.5 and inst.engine.max_model_len == 256
    assert inst.engine.max_num_seqs == 1 and inst.engine.enforce_eager and inst.speculative is None
    assert original == _inst()  # the input is not modified
    assert ladder_sets(taken)[-1] == "speculative.method=none" and len(ladder_sets(taken)) == 8


def test_ladder_never_halves_the_context_below_min_model_len() -> None:
    inst = _with(_inst("cpu"), max_model_len=8192)
    _, taken = _walk(inst, min_model_len=3000)
    assert [t.set for t in taken if t.rung == "context length"] == [
        "engine.max_model_len=4096",
        "engine.max_model_len=3000",
    ]
    inst = _with(inst, max_model_len=2048)  # already below the floor: the rung is skipped
    assert next_rung(inst, [], 3000).rung == "concurrent sequences"


def test_ladder_never_climbs_back_and_skips_an_override_the_replan_did_not_follow() -> None:
    inst = _inst()
    first = next_rung(inst, [], 256)
    assert first.set == "engine.gpu_memory_utilization=0.55"
    # the re-plan did not follow (the instance still says 0.6): the same override is not taken again
    assert next_rung(inst, [first], 256).rung == "context length"
    # once on the context rung, a memory share still above the floor is left alone
    ctx = Rung("context length", "engine.max_model_len=512", "")
    assert next_rung(_apply(inst, ctx), [ctx], 256).set == "engine.max_model_len=256"


def test_ladder_on_cpu_skips_the_memory_share() -> None:
    step = next_rung(_inst("cpu"), [], 256)
    assert step.rung == "context length" and step.change == "max_model_len 1024 -> 512"
    assert step.set == "engine.max_model_len=512"


def test_ladder_bottom_is_none() -> None:
    inst = dataclasses.replace(
        _with(_inst(), gpu_memory_utilization=0.5, max_model_len=256, max_num_seqs=1, enforce_eager=True),
        speculative=None,
    )
    assert next_rung(inst, [], 256) is None


NON_DEFAULT = "(APIServer pid=1) INFO 11-29 [api_utils.py:286] non-default args: {'model_tag': '/m', 'max_model_len': 512, 'enforce_eager': True, 'kv_cache_memory_bytes': 300000, 'max_num_seqs': 4}\n"


def test_startup_verification_reports_both_values(host_of, empty_root) -> None:
    import dataclasses

    from hwprofile.pipeline import make_plan

    started = parse_startup(
        NON_DEFAULT
        + "(EngineCore pid=2) INFO [kv_cache_utils.py:2327] CPU KV cache size: 512 tokens, Maximum concurrency\n"
    )
    assert started["kv_cache_tokens"] == 512 and started["non_default_args"]["max_model_len"] == 512
    real = make_plan(
        host_of("no-driver"),
        empty_root,
        model="Qwen/Qwen3-0.6B",
        sets=["speculative.method=none"],
        environ={},
    ).instances[0]
    inst = dataclasses.replace(
        real,
        engine=dataclasses.replace(
            real.engine,
            max_model_len=512,
            max_num_seqs=4,
            enforce_eager=True,
            kv_cache_memory_bytes=64 * 2**20,
        ),
        memory=dataclasses.replace(real.memory, kv_tokens=131072, block_size=128, vllm_logged_kv_tokens=None),
    )
    warnings = compare(inst, started)
    assert "kv_cache_memory_bytes: planned 67108864, vLLM started with 300000" in warnings
    assert "KV cache: planned 131072 tokens, vLLM reports 512 tokens" in warnings
    assert not [w for w in warnings if w.startswith(("max_model_len", "max_num_seqs", "enforce_eager"))]


def test_rotating_log_caps_size_and_drops_the_oldest(tmp_path) -> None:
    log = RotatingLog(tmp_path / "inst", max_bytes=4 * 4096, files=4)
    for i in range(2000):
        log.write(f"line {i:05d} " + "x" * 40 + "\n")
    files = sorted(p.name for p in (tmp_path / "inst").iterdir())
    assert files == ["vllm.log", "vllm.log.1", "vllm.log.2", "vllm.log.3"]
    assert sum(p.stat().st_size for p in (tmp_path / "inst").iterdir()) <= 4 * 4096 + 100
    assert stat.S_IMODE((tmp_path / "inst").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (tmp_path / "inst").iterdir())
    assert "line 01999" in (tmp_path / "inst" / "vllm.log").read_text()
    assert "line 00000" not in "".join(p.read_text() for p in (tmp_path / "inst").iterdir())
    assert log.last_line().startswith("line 01999")
    mark = log.count
    log.write("after the mark\n")
    assert log.text_since(mark) == "after the mark" and log.text_since(log.count) == ""


def test_state_file_is_atomic_and_private(tmp_path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    path = rt / "state.json"
    write_doc(path, SupervisorDoc(identify(os.getpid())))
    doc = read_doc(path, SupervisorDoc)
    assert doc is not None and doc.supervisor_pid == os.getpid()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("{broken")
    with pytest.raises(RunFileError, match=r"state\.json:1:2: invalid JSON"):
        read_doc(path, SupervisorDoc)


# -- a headless node of a multi-node group (supervise/group.py) -------------------------------------


def test_a_headless_node_is_ready_only_with_the_group_it_could_join() -> None:
    from hwprofile.supervise.group import Head, judge

    down, up, up_again = Head(False), Head(True, 1000.0), Head(True, 2000.0)
    # node 0 was not serving when this process started: node 0 answering means the group formed with it
    assert judge(down, down).why == "waiting for node 0 to form the group" and not judge(down, down).ready
    assert judge(down, up).ready and judge(None, up).ready
    # node 0 already served a group then (this node's last process was in it): not ready; probe it
    v = judge(up, up)
    assert not v.ready and v.probe and not v.rejoin and "formed before this node's process started" in v.why
    assert judge(Head(True), Head(True)).probe  # no start time known: the same server, to be safe
    # that group ended: start a process that can join the next one
    v = judge(up, down)
    assert v.rejoin and not v.ready and not v.probe
    # node 0 answers from a new API server: the new group formed, with this node in it
    assert judge(up, up_again).ready


def test_start_time_is_read_off_metrics_text() -> None:
    from hwprofile.telemetry.metrics import start_time

    body = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.79618485127e+09\nvllm:x 1\n"
    assert start_time(body) == 1.79618485127e09
    assert start_time("vllm:x 1\n") is None
    assert start_time("process_start_time_seconds NaN\n") is None
    assert start_time("process_start_time_seconds 1\nprocess_start_time_seconds 2\n") is None  # which one?
    assert start_time("process_start_time_seconds {{{\n") is None


def test_the_start_up_progress_note_is_vllm_s_message_cut_at_its_end() -> None:
    """The demo's progress line repeated vLLM's last log line cut from the left ("ith error current
    limit exceeds ..."): now the message without vLLM's prefix, cut at its end."""
    from hwprofile.supervise.instance import progress_text

    line = "(APIServer pid=1234) INFO 12-04 19:00:00 [api_server.py:12] Starting vLLM API server on http://127.0.0.1:8000"
    assert progress_text(line) == "Starting vLLM API server on http://127.0.0.1:8000"
    long = (
        "(EngineCore_DP0 pid=9) WARNING 12-04 19:00:01 [cpu.py:3] with error current limit exceeds "
        + "x" * 200
    )
    said = progress_text(long, width=60)
    assert said.startswith("with error current limit exceeds") and said.endswith("…") and len(said) == 60
    assert progress_text("  a plain line ") == "a plain line"


def test_the_evidence_of_an_unknown_failure_is_the_line_that_says_what_went_wrong() -> None:
    """Not the last line (vLLM's shutdown chatter after the error): the exception, the ERROR line or the
    kill, and the last line only when nothing says more."""
    from hwprofile.supervise.failures import exit_evidence

    log = (
        "INFO 12-04 19:00:00 [api_server.py:1] starting\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in <module>\n'
        "ZeroDivisionError: division by zero\n"
        "INFO 12-04 19:00:01 [launcher.py:9] Shutting down FastAPI HTTP server.\n"
        "INFO:     Application shutdown complete.\n"
    )
    assert classify(log).evidence == "ZeroDivisionError: division by zero"
    assert exit_evidence(log) == "ZeroDivisionError: division by zero"
    killed = "INFO loading\n/bin/sh: line 1:   123 Killed   vllm serve m\nINFO bye\n"
    assert exit_evidence(killed) == "/bin/sh: line 1:   123 Killed   vllm serve m"
    assert classify("INFO a\nINFO b\n").evidence == "INFO b" and exit_evidence("") is None


def test_a_server_that_finished_starting_and_died_before_its_check_answered_is_an_unplanned_exit() -> None:
    """Its readiness check got no answer in time (a loaded machine), but its log says it served: the
    failure is the exit after start-up, with the line that says why, not an unknown start-up failure."""
    log = (
        "INFO 12-07 08:00:55 [api_server.py:2000] Starting vLLM API server 0 on http://127.0.0.1:8000\n"
        "INFO:     Application startup complete.\n"
        "ERROR 12-07 08:00:56 [core_client.py:600] Engine core proc EngineCore_DP0 died unexpectedly, "
        "shutting down client.\n"
        "INFO:     Shutting down\n"
    )
    f = classify(log)
    assert (f.kind, f.retry, f.memory_like) == ("unplanned exit", True, False)
    assert f.evidence.startswith("Engine core proc EngineCore_DP0 died unexpectedly")
    # a known message still wins, and a server that never said it started stays unknown
    assert classify(log + "torch.OutOfMemoryError: CUDA out of memory.\n").kind == "out of memory"
    assert classify(log.replace("Application startup complete", "Waiting for startup")).kind == "unknown"
    # nothing after it: its last line, the start-up's own
    alone = classify(log.split("ERROR")[0])
    assert (alone.kind, alone.evidence) == ("unplanned exit", "INFO:     Application startup complete.")
