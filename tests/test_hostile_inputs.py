"""Inputs that used to hang or exhaust hwprofile: a FIFO or a device in a ``--proc-root`` tree, a
cpulist of four billion CPUs, a FIFO planted as the supervisor's lock, a site rule whose pattern a
backtracking engine needs forever for. Each is refused or bounded, with the reason, in time."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import runcli

from hwprofile.host.linux import parse_cpulist, read_cpu, read_numa_nodes
from hwprofile.runtime.lock import LockFileError
from hwprofile.supervise.runfiles import LOCK_FILE, lock_held


def hw(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile(*args, extra_env=env, timeout=timeout)


def test_a_cpulist_of_billions_is_an_error_not_a_list() -> None:
    with pytest.raises(ValueError, match="numbered 0 to 16383"):
        parse_cpulist("0-4000000000")
    with pytest.raises(ValueError, match="ascending"):
        parse_cpulist("8-3")
    assert parse_cpulist("0-3,8") == [0, 1, 2, 3, 8]


def test_procfs_and_sysfs_fifos_and_devices_are_refused_not_waited_on(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    os.mkfifo(proc / "cpuinfo")  # nobody writes: a plain open() would wait forever
    errors: list = []
    cpu = read_cpu(proc, errors)
    assert cpu.logical_cpus == os.cpu_count() and "a FIFO" in errors[0].message, errors
    node = tmp_path / "sys" / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-4000000000\n")
    errors = []
    assert read_numa_nodes(tmp_path / "sys", errors) == () and "numbered 0 to" in errors[0].message
    if os.geteuid() == 0:
        (node / "cpulist").unlink()
        os.mknod(node / "cpulist", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: no end
        errors = []
        assert read_numa_nodes(tmp_path / "sys", errors) == () and "character device" in errors[0].message


def test_detect_and_plan_with_a_fifo_in_the_proc_root_finish(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(
        "/proc/sys/kernel",
        proc / "sys" / "kernel",
        dirs_exist_ok=True,
        ignore=lambda d, names: [n for n in names if n not in ("hostname", "osrelease")],
    )
    os.mkfifo(proc / "cpuinfo")
    os.mkfifo(proc / "meminfo")
    r = hw(
        "detect",
        "--json",
        "--proc-root",
        str(proc),
        env={"HWPROFILE_NVML_LIBRARY": "/nonexistent.so"},
        timeout=30,
    )
    assert r.returncode == 0 and "a FIFO" in r.stdout, r.stderr


def test_a_fifo_planted_as_the_lock_is_refused(tmp_path: Path) -> None:
    rt = tmp_path / "run"
    rt.mkdir(mode=0o700)
    os.mkfifo(rt / LOCK_FILE)
    with pytest.raises(LockFileError, match="not a regular file"):
        lock_held(rt)
    r = hw("status", "--runtime-dir", str(rt), timeout=20)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr


def test_a_catastrophic_site_rule_cannot_hang_planning(tmp_path: Path) -> None:
    """``^(([\\w ]+)+)+X$`` against a GPU name takes a backtracking engine about 2^len(name) steps
    (every plan, and the daemon's live reload, hung on it); RE2, the rule patterns' engine, answers
    in linear time. Run in a child with a deadline, so that a hang fails the test."""
    code = (
        "from hwprofile.match.rules import predicate\n"
        "p = predicate('gpu_name', r'^(([\\w ]+)+)+X$')\n"
        "print(bool(p.search('NVIDIA GeForce RTX 4090 with a long board name here')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    with pytest.raises(ValueError, match="no back-references"):
        from hwprofile.match.rules import predicate

        predicate("gpu_name", r"(RTX)\1")


def test_thresholds_out_of_order_are_refused_naming_both_sources(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    r = hw(
        "plan",
        "--config-root",
        str(tmp_path / "etc"),
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--set",
        "watch.warm_c=100",
        "--set",
        "watch.hot_c=95",
        "--set",
        "watch.critical_c=90",
    )
    assert r.returncode == 2, r.stderr
    assert "watch.warm_c = 100 must be below watch.hot_c = 95" in r.stderr
    assert "watch.hot_c from cli --set watch.hot_c=95" in r.stderr and "watch.critical_c = 90" in r.stderr


def test_a_draft_that_is_the_target_is_said(host_of, empty_root) -> None:
    from hwprofile.pipeline import make_plan

    p = make_plan(
        host_of("rtx4090-1x"),
        empty_root,
        environ={},
        model="Qwen/Qwen2.5-7B-Instruct",
        draft="Qwen/Qwen2.5-7B-Instruct",
    )
    assert any("is the target itself" in w for w in p.warnings), p.warnings
    q = make_plan(
        host_of("rtx4090-1x"),
        empty_root,
        environ={},
        model="Qwen/Qwen2.5-7B-Instruct",
        draft="Qwen/Qwen2.5-0.5B-Instruct",
    )
    assert not any("is the target itself" in w for w in q.warnings), q.warnings


def test_careless_operator_inputs(tmp_path: Path) -> None:
    """A relative --model DIR is planned as an absolute path (vLLM runs in another directory); a
    server.vllm_command that does not exist is refused at once, not retried with backoff."""
    import json

    model = tmp_path / "work" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
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
        )
    )
    (tmp_path / "etc").mkdir()
    env = {
        **os.environ,
        "HWPROFILE_CONFIG_ROOT": str(tmp_path / "etc"),
        "HWPROFILE_RUNTIME_DIR": str(tmp_path / "run"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "plan", "--json", "--model", "tiny"],
        cwd=model.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["path"] == str(model)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwprofile",
            "launch",
            "--foreground",
            "--model",
            str(model),
            "--set",
            "server.vllm_command=/nonexistent/vllm",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "server.vllm_command /nonexistent/vllm: no such executable" in r.stderr, (
        r.stderr
    )
