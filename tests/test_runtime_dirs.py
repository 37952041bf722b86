"""Runtime and log directories (issue 10): per-user, created by hwprofile, checked with ``lstat``;
hwprofile never changes the mode of a directory it did not create, and refuses one that is a link,
another user's, or writable by others without the sticky bit. And the launch file a detached
supervisor starts from (the plan validated once, with its inputs for re-plans)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwprofile.launch.detached import read_launch_file, write_launch_file
from hwprofile.launch.start import Launch, log_root, preflight, supervisor
from hwprofile.pipeline import PlanInputs
from hwprofile.render.versions import release
from hwprofile.runtime.dirs import UnsafeDirectory, private_dir, user_dirname
from hwprofile.supervise.logs import RotatingLog
from hwprofile.supervise.runfiles import LAUNCH_FILE, RunFileError

NOBODY = 65534
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 2048,
    "torch_dtype": "bfloat16",
}


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A 0755 directory standing in for /var/log: it exists, and it is not hwprofile's."""
    d = tmp_path / "var-log"
    d.mkdir()
    d.chmod(0o755)
    return d


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> PlanInputs:
    from hwprofile.host.detect import detect_host

    base = tmp_path_factory.mktemp("dirs")
    model = base / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    (base / "etc").mkdir()
    sets = ("engine.max_model_len=512", "cpu.kv_cache_space_gib=0.0625", "speculative.method=none")
    return PlanInputs(detect_host(), str(base / "etc"), sets=sets, model=str(model))


@pytest.fixture
def other_users_dir() -> Iterator[Path]:
    """A directory made by uid 65534 (tests run as root: setpriv drops to nobody for the mkdir),
    in a sticky /tmp directory that nobody can reach."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to create a directory as another user")
    parent = Path(tempfile.mkdtemp(prefix="hwpt-dirs-", dir="/tmp"))
    parent.chmod(0o1777)
    d = parent / "theirs"
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "mkdir", str(d)], check=True
    )
    assert os.lstat(d).st_uid == NOBODY
    yield d
    shutil.rmtree(parent, ignore_errors=True)


# -- the reproduction: logs.dir=/var/log turned /var/log 0700 ----------------------------------------


def test_a_given_logs_dir_keeps_its_mode_and_gets_hwprofiles_own_subdirectory(
    shared: Path, tmp_path: Path, inputs: PlanInputs
) -> None:
    plan = inputs.replan([f"logs.dir={shared}"])
    runtime = tmp_path / "run"
    root = log_root(plan, "/dev/shm", runtime)
    assert root == shared / user_dirname()  # the given dir, not the tmpfs, and never the dir itself
    launch = Launch(plan, release("0.32.0"), "/nonexistent/vllm", None, "/dev/shm", runtime)
    preflight(launch)
    sup = supervisor(launch)
    try:
        log_dir = Path(sup.instances[0].log.dir)
        assert log_dir.parent == root and mode(log_dir) == 0o700 and mode(root) == 0o700
    finally:
        sup.close()
    assert mode(shared) == 0o755  # before the fix: 0700
    assert mode(runtime) == 0o700


def test_an_existing_directory_of_ours_is_used_as_it_is(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    d.chmod(0o750)
    assert private_dir(d) == d and mode(d) == 0o750  # checked, not chmod'ed
    RotatingLog(d / "inst", 1 << 20).write("x\n")
    assert mode(d) == 0o750 and mode(d / "inst") == 0o700
    assert mode(d / "inst" / "vllm.log") == 0o600


def test_a_missing_directory_is_created_0700_with_its_parents(tmp_path: Path) -> None:
    old = os.umask(0o077)  # even a umask that leaves nothing: the directory hwprofile made is 0700
    try:
        d = private_dir(tmp_path / "a" / "b" / "run")
    finally:
        os.umask(old)
    assert d.is_dir() and mode(d) == 0o700 and os.lstat(d).st_uid == os.geteuid()


def test_per_user_names(monkeypatch: pytest.MonkeyPatch, inputs: PlanInputs) -> None:
    import dataclasses

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert user_dirname() == "hwprofile"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert user_dirname() == "hwprofile-1000"
    plan = inputs.replan()
    plan = dataclasses.replace(plan, logs=dataclasses.replace(plan.logs, dir=None))
    assert log_root(plan, "/dev/shm", Path("/run/x")) == Path("/dev/shm/hwprofile-1000")
    assert log_root(plan, None, Path("/run/x")) == Path("/run/x/logs")


# -- refusals ----------------------------------------------------------------------------------------


def test_a_symlink_is_refused_and_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o755)
    link = tmp_path / "run"
    link.symlink_to(target)
    with pytest.raises(UnsafeDirectory, match="is a symbolic link"):
        private_dir(link)
    assert mode(target) == 0o755 and not list(target.iterdir())


def test_a_directory_of_another_user_is_refused(other_users_dir: Path) -> None:
    d = other_users_dir
    with pytest.raises(UnsafeDirectory, match=r"owned by uid 65534 .*not by this user"):
        private_dir(d)
    with pytest.raises(UnsafeDirectory, match=r"owned by uid 65534 .*does not create inst in it"):
        RotatingLog(d / "inst", 1 << 20)  # nothing is created inside it either
    assert not (d / "inst").exists()


def test_a_directory_writable_by_others_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    for bits, who in ((0o777, "group and others"), (0o775, "group"), (0o757, "others")):
        d.chmod(bits)
        with pytest.raises(
            UnsafeDirectory, match=f"writable by {who} \\(mode 0{bits:o}\\) without the sticky bit"
        ):
            private_dir(d)
        assert mode(d) == bits  # refused, and left as it was
    d.chmod(0o1777)
    assert private_dir(d) == d and mode(d) == 0o1777  # sticky: others cannot replace what is ours


def test_nothing_is_created_where_others_could_replace_it(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=r"writable by others .*does not create hwprofile in it"):
        private_dir(parent / "hwprofile")
    assert not (parent / "hwprofile").exists() and mode(parent) == 0o777
    parent.chmod(0o1777)  # a sticky shared directory, like /tmp or /dev/shm
    assert mode(private_dir(parent / "hwprofile")) == 0o700 and mode(parent) == 0o1777


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("")
    with pytest.raises(UnsafeDirectory, match="is not a directory"):
        private_dir(tmp_path / "run")


def test_the_cli_refuses_with_the_reason(tmp_path: Path, inputs: PlanInputs, other_users_dir: Path) -> None:
    victim = other_users_dir
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(HWPROFILE_CONFIG_ROOT=inputs.config_root)
    from vllmtools import fake_vllm_shim

    shim = fake_vllm_shim(tmp_path / "vllm")  # a vLLM to run, so that the directory is what refuses
    args = [
        "--model",
        str(inputs.model),
        *(f"--set={s}" for s in inputs.sets),
        f"--set=logs.dir={logs}",
        f"--set=server.vllm_command={shim}",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "hwprofile", "launch", "--runtime-dir", str(victim), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "hwprofile: error:" in r.stderr and "owned by uid 65534" in r.stderr
    assert "Traceback" not in r.stderr and not list(victim.iterdir())


# -- the launch file ------------------------------------------------------------------------------------


def test_the_launch_file_is_private_atomic_and_round_trips(tmp_path: Path, inputs: PlanInputs) -> None:
    plan = inputs.replan()
    path = write_launch_file(Launch(plan, release("0.32.0"), "vllm", None, None, tmp_path / "run", inputs))
    assert path == tmp_path / "run" / LAUNCH_FILE and mode(path) == 0o600
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    doc = read_launch_file(path)
    got, again, version = doc.plan, doc.inputs, doc.vllm_version
    assert version == "0.32.0" and got == plan  # the typed Plan back, its settings sections too
    assert got.to_json() == json.loads(json.dumps(plan.to_json()))
    assert again.sets == inputs.sets and again.model == inputs.model
    assert again.host.to_dict() == inputs.host.to_dict()  # no second detection: the same host
    extra = ["engine.max_model_len=256"]
    assert again.replan(extra) == inputs.replan(extra) and again.min_model_len() == 256
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(RunFileError, match=r"--plan-file .*a symbolic link"):
        read_launch_file(link)
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    with pytest.raises(RunFileError, match=r"not a hwprofile\.launch/1 document: schema"):
        read_launch_file(bad)


def test_a_launch_file_whose_plan_was_edited_is_not_used(tmp_path: Path, inputs: PlanInputs) -> None:
    """The detached supervisor hands vLLM the plan of the launch file: one edited there (a negative
    max_num_seqs) is refused, because it is not what the file's own inputs plan."""
    plan = inputs.replan()
    path = write_launch_file(Launch(plan, release("0.32.0"), "vllm", None, None, tmp_path / "run", inputs))
    doc = json.loads(path.read_text())
    doc["plan"]["instances"][0]["engine"]["max_num_seqs"] = -5
    path.write_text(json.dumps(doc))
    with pytest.raises(RunFileError, match=r"plan\.instances\[0\]\.engine\.max_num_seqs: -5 in the file"):
        read_launch_file(path)
