"""``hwprofile launch``, ``status``, ``stop``, ``daemon``, ``watch``, ``reload`` and ``install-service``:
running vLLM under supervision, watching it, and the systemd service around the daemon."""

from __future__ import annotations

import argparse
import re
import sys

from ..errors import EXIT_OK, HwprofileError
from .common import CliError, demo_model, launch_of, load_host, plan_of


def cmd_launch(args: argparse.Namespace) -> int:
    import shlex

    from ..launch.start import foreground, setup_logging
    from ..runtime.dirs import runtime_dir

    runtime = runtime_dir(args.runtime_dir)
    if args.plan_file:  # the detached supervisor: the plan its parent validated, not planned again
        return _launch_from_file(args, runtime)
    host = load_host(args)
    model, sets = args.model, list(args.sets)
    if args.demo:
        model, sets = demo_model(sets)
    plan, inputs = plan_of(args, host, model=model, sets=sets)
    if args.dry_run:
        from ..launch.start import release_for
        from ..pipeline import vllm_command
        from ..render.translate import render_instance

        configured = {i.server.vllm_command for i in plan.instances if i.server.vllm_command}
        rel = release_for(host.software, configured, args.vllm_version)  # the release that would run
        for inst in plan.instances:
            r = render_instance(
                plan, inst, rel, vllm_command(inst.server.vllm_command), host.software.numactl_path
            )
            print(f"# {r.name}: vLLM {r.vllm_version}, GPUs {r.gpus or '-'}, NUMA node {r.numa_node}")
            for k, v in sorted(r.env.items()):
                print(f"{k}={shlex.quote(v)}")
            for k, src in r.secrets.items():
                print(f"# {k} from ${src}")
            print(shlex.join(r.argv))
            for w in r.warnings:
                print(f"hwprofile: warning: {r.name}: {w}", file=sys.stderr)
        return EXIT_OK
    if args.demo:
        from ..launch.demo import run_demo
        from ..launch.start import preflight

        launch = launch_of(
            args, host, plan, inputs, runtime, lambda m: print(f"hwprofile: {m}", file=sys.stderr)
        )
        preflight(launch)  # refused before hwprofile's log goes into the runtime directory
        setup_logging(runtime, to_stderr=True)
        return run_demo(launch)
    launch = launch_of(args, host, plan, inputs, runtime)
    if args.foreground:
        from ..launch.start import preflight

        preflight(launch)
        setup_logging(runtime, to_stderr=True)
        return foreground(launch)
    from ..launch.detached import run_detached
    from ..launch.start import preflight

    preflight(launch)  # the detached supervisor checks again; refusals are said here, before it starts
    return run_detached(launch, plan.supervise.ready_timeout + 30)


def _launch_from_file(args: argparse.Namespace, runtime) -> int:
    """``launch --plan-file FILE``: supervise, in this process, the plan (and its inputs, for the
    memory ladder's re-plans) that a detached ``launch`` wrote; no detection, no second planning."""
    from ..launch.detached import read_launch_file
    from ..launch.start import Launch, foreground, setup_logging
    from ..pipeline import vllm_command
    from ..render.versions import release

    doc = read_launch_file(args.plan_file)
    sw = doc.inputs.host.software
    setup_logging(runtime, to_stderr=True)
    launch = Launch(
        doc.plan,
        release(doc.vllm_version),
        vllm_command(None),
        sw.numactl_path,
        sw.tmpfs_path,
        runtime,
        doc.inputs,
        router=sw.router_path,
    )
    return foreground(launch)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from ..launch.status import format_status, status
    from ..runtime.dirs import runtime_dir

    st = status(runtime_dir(args.runtime_dir))
    if args.json:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
    else:
        sys.stdout.write(format_status(st))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from ..launch.stop import stop
    from ..runtime.dirs import runtime_dir

    for line in stop(runtime_dir(args.runtime_dir)):
        print(f"hwprofile: {line}")
    return EXIT_OK


def cmd_daemon(args: argparse.Namespace) -> int:
    """Launch every planned instance, then watch and act by policy until SIGTERM/SIGINT. As PID 1 (a
    container's entrypoint) the process first splits in two: PID 1 reaps and forwards signals, its
    child runs the daemon (:mod:`hwprofile.runtime.init`)."""
    from pathlib import Path

    from ..runtime.init import become_init

    in_container = become_init()  # returns at once unless this is PID 1; there, only in the child
    from ..daemon.main import run_daemon
    from ..errors import InputError
    from ..launch.start import preflight, setup_logging
    from ..runtime.dirs import runtime_dir, state_dir
    from ..supervise.runfiles import LAST_GOOD_FILE

    host = load_host(args)
    runtime = runtime_dir(args.runtime_dir)
    state = state_dir(args.state_dir)
    started_from = None
    try:
        plan, inputs = plan_of(
            args, host
        )  # the same inputs for every re-plan: degrade steps, the ladder, reloads
        launch = launch_of(args, host, plan, inputs, runtime)
    except InputError as e:  # an invalid configuration: the plan that last ran well, if one is kept
        kept = _last_good(state)
        if kept is None:
            raise
        started_from = (
            f"the configuration is invalid ({'; '.join(e.messages())}): started from the last good plan "
            f"({state / LAST_GOOD_FILE}); fix it, then `hwprofile reload`"
        )
        inputs = kept.inputs
        launch = launch_of(args, kept.inputs.host, kept.plan, inputs, runtime)
    preflight(launch)
    setup_logging(runtime, to_stderr=True)
    root = inputs.config_root
    return run_daemon(
        launch,
        watch_root=Path(root) if args.watch_config and root else None,
        watch_quiet_s=args.watch_quiet,
        state_dir=state,
        started_from=started_from,
        in_container=in_container,
    )


def _last_good(state):  # -> LaunchDoc | None
    """The daemon's last good plan in ``state``, when one is kept and can be trusted; None (the
    error stands) otherwise."""
    from ..supervise.runfiles import LAST_GOOD_FILE, LaunchDoc, RunFileError, read_doc

    try:
        return read_doc(state / LAST_GOOD_FILE, LaunchDoc)
    except RunFileError as e:
        print(f"hwprofile: the last good plan is not used: {e}", file=sys.stderr)
        return None


def cmd_watch(args: argparse.Namespace) -> int:
    from .watch import run_watch

    return run_watch(
        args.url,
        _watch_settings(args),
        args.once,
        args.json,
        args.interval,
        args.draft_cost,
        args.max_num_seqs,
    )


def _watch_settings(args: argparse.Namespace):  # -> Watch
    """The ``watch`` settings of the profile this host matches (and the command's overrides)."""
    from ..pipeline import config_root, resolve_settings

    host = load_host(args)
    res = resolve_settings(
        host, args.config_root or config_root(), args.profile, args.overrides, args.set, None
    )
    return res.settings.watch


def cmd_install_service(args: argparse.Namespace) -> int:
    from ..daemon.service import install

    extra = args.daemon_args[1:] if args.daemon_args[:1] == ["--"] else args.daemon_args
    daemon = _check_daemon_args(extra, args.daemon_parser())
    if args.run_as is not None and not USER_NAME.fullmatch(args.run_as):
        raise CliError(
            f"--run-as {args.run_as!r}: not a user name (letters, digits, '_' and '-', a letter or '_' first, "
            "at most 32; systemd's User= takes nothing else)"
        )
    drain = _drain_of(daemon)
    if args.stop_timeout is not None and not sum(drain) < args.stop_timeout <= 86400:
        raise CliError(
            f"--stop-timeout {args.stop_timeout}: must be more than the planned drain ({sum(drain):g} s: "
            "server.shutdown_timeout + supervise.stop_margin) and at most 86400"
        )
    for line in install(extra, args.prefix, args.user, args.stop_timeout, args.run_as, drain):
        print(f"hwprofile: {line}")
    return EXIT_OK


# a user name systemd's User= accepts and useradd would make: no shell or unit syntax can hide in it
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,30}[$]?")


def _check_daemon_args(extra: list[str], parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments ExecStart will give ``hwprofile daemon``, parsed by the daemon's own ``parser``
    here (a typo would make a unit whose daemon refuses to start), without control characters (a
    newline would be a new unit line if anything ever wrote it unquoted)."""
    import contextlib
    import io

    for a in extra:
        if any(ord(c) < 32 or ord(c) == 127 for c in a):
            raise CliError(f"daemon argument {a!r}: control characters are not allowed in ExecStart")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(["daemon", *extra])
    except SystemExit:
        why = err.getvalue().strip().splitlines()
        raise CliError(
            f"`hwprofile daemon {' '.join(extra)}` would not start: {why[-1] if why else 'invalid'}"
        ) from None


def _drain_of(daemon: argparse.Namespace) -> tuple[float, float]:
    """``(server.shutdown_timeout, supervise.stop_margin)`` as the daemon will resolve them on this
    host, the config root's overrides included."""
    from ..config.layers import config_root
    from ..pipeline import resolve_settings

    try:
        host = load_host(daemon)
        res = resolve_settings(
            host, config_root(daemon.config_root), daemon.profile, daemon.overrides, daemon.sets
        )
    except HwprofileError as e:
        raise CliError(f"the daemon's settings: {'; '.join(e.messages())}") from None
    return float(res.settings.server.shutdown_timeout), res.settings.supervise.stop_margin


def cmd_reload(args: argparse.Namespace) -> int:
    from ..daemon.service import signal_reload
    from ..runtime.dirs import runtime_dir

    for line in signal_reload(runtime_dir(args.runtime_dir)):
        print(f"hwprofile: {line}")
    return EXIT_OK
