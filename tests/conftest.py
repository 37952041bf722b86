from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# No test reaches the real Hugging Face Hub: a model name that is neither a directory nor in the catalog
# is an offline error here (tests/test_hub.py serves its own stand-in Hub and sets its own environment).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Detection finds vLLM's router where it is installed (the test environment may have it): a test host
# has none unless a test says so, so that a plan's front (router or nginx) does not depend on the machine.
os.environ.setdefault("HWPROFILE_ROUTER", "none")

from fakehost import FakeHost, build, compile_fake_nvml


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A directory holding the compiled fake libnvidia-ml.so.1, built once per run: under xdist the
    first worker compiles it into the run's shared temporary root while holding a lock, the others
    wait for it (gcc is most of a second of CPU, four times over on two cores)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # xdist: pytest-N/popen-gwK -> pytest-N
    out = shared / "fakenvml"
    with open(shared / "fakenvml.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").exists():
            compile_fake_nvml(out)
            (out / "built").touch()
    return out


@pytest.fixture
def fake_host(tmp_path: Path, fake_nvml_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """``fake_host(name)`` builds that fixture host and points this process's detection at it.

    The fake library is loaded in-process by full path (HWPROFILE_NVML_LIBRARY); it re-reads its
    state file at every nvmlInit, so one process can visit many hosts.
    """

    def make(name: str) -> FakeHost:
        host = build(name, tmp_path / name)
        monkeypatch.setenv("HWPROFILE_NVML_LIBRARY", str(fake_nvml_dir / "libnvidia-ml.so.1"))
        monkeypatch.setenv("FAKE_NVML_STATE", str(host.state))
        monkeypatch.setenv("HWPROFILE_PROC_ROOT", str(host.proc))
        monkeypatch.setenv("HWPROFILE_SYS_ROOT", str(host.sys))
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / name / "vllm-cache"))  # not this user's own
        monkeypatch.setenv(
            "HWPROFILE_ROUTER", os.environ.get("HWPROFILE_ROUTER", "none")
        )  # a fixture host has none
        # nor FlashInfer or triton_kernels, whatever this machine has installed (the snapshot says so)
        monkeypatch.setattr("hwprofile.host.software.kernel_packages", lambda path=None: ())
        return host

    return make


def cli_env(host: FakeHost | None, lib_dir: Path | None) -> dict[str, str]:
    env = host.env(lib_dir) if host else dict(os.environ)
    for k in ("HWPROFILE_NVML_LIBRARY",):
        env.pop(k, None)
    return env


@pytest.fixture
def host_of(fake_host):
    """``host_of(name)``: the HostSnapshot of a fixture host, detected through the fake NVML."""
    from hwprofile.host.detect import detect_host

    def make(name: str):
        fake_host(name)
        return detect_host()

    return make


@pytest.fixture
def empty_root(tmp_path: Path) -> Path:
    """A config root with nothing in it (tests never read /etc/hwprofile)."""
    root = tmp_path / "etc-hwprofile"
    root.mkdir()
    return root


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked slow (real vLLM, a real systemd manager) go to two xdist groups, a whole test
    file to one: at most two of them run at once (a real vLLM CPU server needs a core; two fit two
    cores), each group one test after another. The files are dealt out longest first, each to the group
    with less to do so far, by the ``minutes`` their ``slow`` marker declares (what CI took, under its
    load), so that both groups end near the same time. The fast tests spread over the other workers
    (``-n 4 --dist loadgroup`` in pyproject.toml)."""
    groups = _slow_groups(items)
    config.stash[_GROUPS] = groups
    for item in items:
        if item.path.name in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item.path.name]))


def _slow_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each file with slow tests, and the group it runs in (``real-0`` or ``real-1``)."""
    minutes: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None:
            declared = float(mark.kwargs.get("minutes", 1.0))
            minutes[item.path.name] = max(minutes.get(item.path.name, 0.0), declared)
    load = [0.0, 0.0]
    groups = {}
    for name in sorted(minutes, key=lambda n: (-minutes[n], n)):
        g = 0 if load[0] <= load[1] else 1
        load[g] += minutes[name]
        groups[name] = f"real-{g}"
    return groups


_LOST_GROUP = pytest.StashKey[str]()
_GROUPS = pytest.StashKey[dict[str, str]]()


@pytest.fixture(scope="module", autouse=True)
def _group_core(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each group's vLLM servers compute on a core of their own: vLLM's "auto" OpenMP binding puts every
    server's engine on the same first core (it keeps the rest for its scheduler and API processes), so
    the two groups' servers would share one core while the other serves their API processes. In an
    xdist worker, a module of group ``real-N`` gets ``VLLM_CPU_OMP_THREADS_BIND`` = its core (the N-th
    this process may use; hwprofile passes it through: ``cpu.omp_threads_bind`` auto sets none), for
    its module fixtures too. Not for servers of several ranks (``multi_rank``: vLLM wants a list per
    rank) nor where the variable is set already or fewer than two cores are there."""
    group = request.config.stash.get(_GROUPS, {}).get(request.node.path.name)
    cores = sorted(os.sched_getaffinity(0))
    if (
        group is None
        or "PYTEST_XDIST_WORKER" not in os.environ
        or "VLLM_CPU_OMP_THREADS_BIND" in os.environ
        or request.node.get_closest_marker("multi_rank") is not None
        or len(cores) < 2
    ):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", str(cores[int(group.rsplit("-", 1)[1]) % len(cores)]))
        yield


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` xdist schedules by the group written into each test's id: where that
    write did not take (pytest 9.2 with pytest-xdist 3.8), every slow test would run on any worker, four
    real vLLM servers at once on two cores. Each such test then fails at once, naming the cause."""
    if not session.config.getoption("loadgroup", False):  # set in xdist's workers only
        return
    lost = [i for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        for item in lost:
            item.stash[_LOST_GROUP] = (
                f"pytest-xdist's loadgroup did not take ({len(lost)} tests): pytest {pytest.__version__} "
                "and this pytest-xdist do not work together; install what pyproject.toml's test extra "
                "pins (.venv/bin/pip install -e '.[test,cpu]')"
            )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _LOST_GROUP in item.stash:
        pytest.fail(item.stash[_LOST_GROUP], pytrace=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny model the real-vLLM tests serve (:func:`hwprofile.launch.tinymodel.make_tiny_model`), made
    once per test module; the test fails (CI) or is skipped where vLLM is not installed."""
    from vllmtools import require_vllm

    require_vllm()
    from hwprofile.launch.tinymodel import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")
