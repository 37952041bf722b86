"""What the command modules share: the CLI's own error, the host snapshot of ``--from`` or detection,
the vLLM release to render for, the plan of the command's options (a refusal printed)."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import EXIT_FAILED, EXIT_USAGE, HwprofileError


class CliError(HwprofileError):
    """A user-facing error of the command line itself, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


def load_host(args: argparse.Namespace):  # -> HostSnapshot
    """Node 0's snapshot: the first ``--from``, the inventory's first node, or this host, detected."""
    hosts, _ = load_hosts(args)
    if hosts:
        return hosts[0]
    from ..host.detect import detect_host

    if stdin_has_input():
        print(
            "hwprofile: standard input is not read: to use a snapshot piped in, add --from - "
            "(this host is probed instead)",
            file=sys.stderr,
        )
    return detect_host(proc_root=args.proc_root, sys_root=args.sys_root)


def stdin_has_input() -> bool:
    """What a snapshot piped in without ``--from -`` looks like, already there when asked: standard
    input is a file with a JSON object ahead of its offset, or a pipe or socket with bytes waiting.
    Never reads or moves it (``pread``, ``FIONREAD``); False for a terminal, /dev/null, a pipe at its end
    or with nothing written yet."""
    import fcntl
    import stat
    import struct
    import termios

    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            ahead = os.pread(fd, 64, os.lseek(fd, 0, os.SEEK_CUR))
            return ahead.lstrip().startswith(b"{")
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            waiting = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
            return struct.unpack("i", waiting)[0] > 0
    except (OSError, ValueError, AttributeError):  # closed, replaced (pytest), or no descriptor
        return False
    return False


def load_hosts(args: argparse.Namespace):  # -> (list[HostSnapshot], list[str])
    """Every host of the command (``--from`` given again for each, or ``--inventory``), node 0
    first, and their addresses (the inventory's; else each snapshot's hostname); empty without.
    Read once per command: a later call gets the same hosts (``--from -`` is standard input, which
    a second read would find empty)."""
    loaded = getattr(args, "_loaded_hosts", None)
    if loaded is not None:
        return loaded
    loaded = _read_hosts(args)
    args._loaded_hosts = loaded
    return loaded


def _read_hosts(args: argparse.Namespace):  # -> (list[HostSnapshot], list[str])
    files = list(getattr(args, "from_file", None) or [])
    addresses: list[str] = []
    inventory = getattr(args, "inventory", None)
    if not files and not inventory:
        return [], []  # this host, detected: the snapshot readers are not needed
    from ..config.fields import address_problem
    from ..host.snapshot import SnapshotError
    from ..host.snapshot_io import load_snapshot

    if inventory:
        if files:
            raise CliError("--inventory and --from name the hosts two ways: give one")
        files, addresses = _inventory(inventory)
    hosts = []
    for f in files:
        try:
            hosts.append(load_snapshot(f))
        except SnapshotError as e:
            raise CliError(str(e)) from None
    if not addresses:
        addresses = [h.hostname or f"node{i}" for i, h in enumerate(hosts)]
        for f, a in zip(files, addresses, strict=False):
            why = address_problem(a) if len(hosts) > 1 else None
            if why:
                raise CliError(f"{f}: hostname: {why} (give --inventory with each node's address)")
    return hosts, addresses


def _inventory(path: str) -> tuple[list[str], list[str]]:
    """``nodes: [{snapshot: FILE, address: ADDR}, ...]`` (snapshot paths relative to the file)."""
    import os

    from ..config.fields import address_problem
    from ..config.yamlsrc import load_file

    data, _ = load_file(path)
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not nodes:
        raise CliError(f"{path}: expected `nodes:` with a list of {{snapshot: FILE, address: ADDR}}")
    files, addresses = [], []
    for i, n in enumerate(nodes):
        if (
            not isinstance(n, dict)
            or not isinstance(n.get("snapshot"), str)
            or not isinstance(n.get("address"), str)
        ):
            raise CliError(f"{path}: nodes[{i}]: expected {{snapshot: FILE, address: ADDR}}")
        why = address_problem(n["address"])
        if why:
            raise CliError(f"{path}: nodes[{i}].address: {why}")
        files.append(os.path.join(os.path.dirname(os.path.abspath(path)), n["snapshot"]))
        addresses.append(n["address"])
    return files, addresses


def render_release(args: argparse.Namespace, host, missing: str):  # -> Release
    """The vLLM release ``render`` formats for: --vllm-version, else the installed one."""
    from ..render.versions import release

    version = getattr(args, "vllm_version", None) or host.software.vllm_version
    if not version:
        raise CliError(missing, EXIT_FAILED)
    return release(version)


def plan_of(args: argparse.Namespace, host, model: str | None = None, sets: list[str] | None = None):
    """``(plan, inputs)`` of the command's options: the inputs a re-plan starts from, and the plan
    made from them (a relative model directory is made absolute first). A refused plan raises
    :class:`hwprofile.plan.PlanRefused`, which ``main`` prints the one way."""
    from ..config.layers import config_root
    from ..pipeline import PlanInputs

    hosts, addresses = load_hosts(args)
    if getattr(args, "revision", None):
        from ..model.hub import with_revision

        model = with_revision(args.model if model is None else model, args.revision)
    rank = getattr(args, "node_rank", None)  # launch and daemon run one node's part; plan and render show all
    inputs = PlanInputs(
        host,
        config_root(args.config_root),
        args.profile,
        tuple(args.overrides),
        tuple(args.sets if sets is None else sets),
        args.model if model is None else model,
        args.draft,
        tuple(hosts[1:]),
        tuple(addresses) if len(hosts) > 1 else (),
        rank or 0,
    )
    return (inputs.whole_plan() if rank is None else inputs.replan()), inputs


def launch_of(args: argparse.Namespace, host, plan, inputs, runtime, progress=None):  # -> Launch
    """The :class:`hwprofile.launch.start.Launch` of a plan: the release is ``--vllm-version``, else
    what the configured ``server.vllm_command`` is, else the installed vLLM. A TP group whose links
    were never proven is checked first (:func:`hwprofile.launch.linkcheck.prove_links`; its plan may
    change, or the start be refused), unless ``--skip-link-check`` or ``supervise.link_check=false``."""
    import dataclasses

    from ..launch.linkcheck import prove_links
    from ..launch.start import Launch

    launch = Launch.of(plan, host.software, runtime, inputs, getattr(args, "vllm_version", None), progress)
    proven = prove_links(plan, inputs, skip=getattr(args, "skip_link_check", False), progress=progress)
    return launch if proven is plan else dataclasses.replace(launch, plan=proven)


# What every `--demo` plans (launch, bench, verify): the tiny model made offline, a short context, a
# small CPU KV space and eager mode; the user's own --set options come after, so they win.
DEMO_SETS = ("engine.max_model_len=512", "cpu.kv_cache_space_gib=0.0625", "engine.enforce_eager=true")


def demo_model(sets: list[str], extra: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """``(model, sets)`` of a ``--demo``: the tiny model (generated on first use) and DEMO_SETS, then
    the command's own ``extra`` defaults, then ``sets``."""
    from ..launch.tinymodel import DEFAULT_DIR, make_tiny_model, tiny_model_ready

    if tiny_model_ready():
        print(f"hwprofile: demo: the tiny model made on the first run ({DEFAULT_DIR})", file=sys.stderr)
    else:
        print(
            "hwprofile: demo: generating a tiny model offline (once; kept for the next runs) ...",
            file=sys.stderr,
        )
    return str(make_tiny_model()), [*DEMO_SETS, *extra, *sets]
