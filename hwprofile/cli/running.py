"""``hwprofile launch``, ``status``, ``stop``, ``daemon``, ``watch``, ``reload`` and ``install-service``:
running vLLM under supervision, watching it, and the systemd service around the daemon."""

from __future__ import annotations

import argparse
import sys

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .common import CliError, _plan_or_report, _Refused, _release, demo_model, load_host


def cmd_launch(args: argparse.Namespace) -> int:
    import os
    import shlex

    from ..config.layers import config_root
    from ..launch import (
        LaunchError,
        PlanInputs,
        check_not_running,
        check_ports,
        prepare_dirs,
        run_detached,
        run_foreground,
        setup_logging,
        write_launch_file,
    )
    from ..pipeline import vllm_command
    from ..render.translate import render_instance
    from ..runtime.dirs import runtime_dir

    if args.plan_file:  # the detached supervisor: the plan its parent validated, not planned again
        return _launch_from_file(args)
    host = load_host(args)
    rel = _release(
        args,
        host,
        "vLLM is not installed here (pip install 'hwprofile[vllm]', or 'hwprofile[cpu]' without a GPU, then hwprofile doctor --fix)",
    )
    model, sets = args.model, list(args.sets)
    if args.demo:
        model, sets = demo_model(sets)
    try:
        plan = _plan_or_report(args, host, model=model, sets=sets)
    except _Refused:
        return EXIT_FAILED
    numactl = host.software.numactl_path
    inputs = PlanInputs(
        host, config_root(args.config_root), args.profile, tuple(os.path.abspath(f) for f in args.overrides),
        tuple(sets), model, args.draft,
    )  # fmt: skip
    if args.dry_run:
        for inst in plan.instances:
            r = render_instance(plan, inst, rel, vllm_command(inst.server.vllm_command), numactl)
            print(f"# {r.name}: vLLM {r.vllm_version}, GPUs {r.gpus or '-'}, NUMA node {r.numa_node}")
            for k, v in sorted(r.env.items()):
                print(f"{k}={shlex.quote(v)}")
            for k, src in r.secrets.items():
                print(f"# {k} from ${src}")
            print(shlex.join(r.argv))
            for w in r.warnings:
                print(f"hwprofile: warning: {r.name}: {w}", file=sys.stderr)
        return EXIT_OK
    runtime = runtime_dir(args.runtime_dir)
    try:
        prepare_dirs(plan, host.software.tmpfs_path, runtime)
        check_not_running(runtime)
        check_ports(plan)
    except LaunchError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return e.code
    if args.demo:
        return _demo(plan, rel, numactl, host.software.tmpfs_path, runtime, inputs)
    if args.foreground:
        setup_logging(runtime, to_stderr=True)
        return run_foreground(
            plan, rel, vllm_command(None), numactl, host.software.tmpfs_path, runtime,
            replan=inputs.replan, min_model_len=inputs.min_model_len(),
        )  # fmt: skip
    plan_file = write_launch_file(runtime, plan, inputs, rel.target)
    timeout = plan.supervise.ready_timeout + 30
    return run_detached(
        ["launch", "--plan-file", str(plan_file), "--runtime-dir", str(runtime)], runtime, timeout
    )


def _launch_from_file(args: argparse.Namespace) -> int:
    """``launch --plan-file FILE``: supervise, in this process, the plan (and its inputs, for the
    memory ladder's re-plans) that a detached ``launch`` wrote; no detection, no second planning."""
    from ..launch import LaunchError, read_launch_file, run_foreground, setup_logging
    from ..pipeline import vllm_command
    from ..render.versions import UnknownVersion, release
    from ..runtime.dirs import UnsafeDirectory, runtime_dir

    try:
        plan, inputs, version = read_launch_file(args.plan_file)
        rel = release(version)
    except (LaunchError, UnknownVersion) as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return getattr(e, "code", EXIT_USAGE)
    runtime = runtime_dir(args.runtime_dir)
    try:
        setup_logging(runtime, to_stderr=True)
    except UnsafeDirectory as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    sw = inputs.host.software
    return run_foreground(
        plan, rel, vllm_command(None), sw.numactl_path, sw.tmpfs_path, runtime,
        replan=inputs.replan, min_model_len=inputs.min_model_len(),
    )  # fmt: skip


def _demo(plan, rel, numactl, tmpfs, runtime, inputs=None) -> int:
    import time

    from ..launch import demo_completion, format_status, options, setup_logging, status
    from ..pipeline import vllm_command
    from ..runtime.processes import pid_alive
    from ..supervise.supervisor import Supervisor

    setup_logging(runtime, to_stderr=True)
    sup = Supervisor(
        plan,
        rel,
        vllm_command(None),
        numactl,
        options(
            plan,
            tmpfs,
            runtime,
            progress=lambda m: print(f"hwprofile: {m}", file=sys.stderr),
            min_model_len=inputs.min_model_len() if inputs else None,
        ),
        replan=inputs.replan if inputs else None,
    )
    t0 = time.monotonic()
    sup.start()
    try:
        if not sup.wait_ready(plan.supervise.ready_timeout):
            print(format_status(status(runtime)), end="")
            return EXIT_FAILED
        inst = sup.instances[0]
        print(f"hwprofile: demo: {inst.name} ready at {inst.url} after {time.monotonic() - t0:.0f} s")
        served = plan.model.path or plan.model.name
        reply = demo_completion(inst.url, served)
        choice = reply["choices"][0]
        prompt_ids, ids = choice.get("prompt_token_ids"), choice.get("token_ids")
        print(
            f"hwprofile: demo: prompt: {reply['prompt']!r}"
            + (f" ({len(prompt_ids)} tokens: {prompt_ids})" if prompt_ids else "")
        )
        n = reply["usage"]["completion_tokens"]
        print(
            f"hwprofile: demo: generated {n} tokens: {ids}"
            if ids is not None
            else f"hwprofile: demo: generated {n} tokens (this vLLM does not return token ids)"
        )
        print(f"hwprofile: demo: decoded text: {choice['text']!r}")
        print(
            "hwprofile: demo: the tiny model's weights are random by design (made offline, nothing "
            "downloaded): the text is gibberish on purpose; what counts is that a real vLLM served a real request"
        )
        print(format_status(status(runtime)), end="")
    finally:
        pids = [i.pid for i in sup.instances]
        sup.stop()
        sup.wait(120)
    left = [p for p in pids if p and pid_alive(p)]
    print(f"hwprofile: demo: stopped cleanly{'' if not left else f'; still running: {left}'}")
    if left:
        return EXIT_FAILED
    print(
        "hwprofile: demo: next, on a GPU host: pip install 'hwprofile[vllm]', then "
        "`hwprofile plan --model NAME --explain` (the plan and the reason for every value) and "
        "`hwprofile launch --model NAME` (NAME: a local model directory or a Hugging Face model name)"
    )
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from ..launch import format_status, status
    from ..runtime.dirs import runtime_dir

    st = status(runtime_dir(args.runtime_dir))
    if args.json:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
    else:
        sys.stdout.write(format_status(st))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from ..launch import stop
    from ..runtime.dirs import runtime_dir

    for line in stop(runtime_dir(args.runtime_dir)):
        print(f"hwprofile: {line}")
    return EXIT_OK


def cmd_daemon(args: argparse.Namespace) -> int:
    """Launch every planned instance, then watch and act by policy until SIGTERM/SIGINT."""
    from pathlib import Path

    from ..config.layers import config_root
    from ..daemon.main import run_daemon
    from ..launch import LaunchError, PlanInputs, check_not_running, check_ports, prepare_dirs, setup_logging
    from ..pipeline import vllm_command
    from ..runtime.dirs import runtime_dir

    host = load_host(args)
    rel = _release(args, host, "vLLM is not installed here (pip install 'hwprofile[vllm]', then hwprofile doctor --fix)")
    try:
        plan = _plan_or_report(args, host)
    except _Refused:
        return EXIT_FAILED
    runtime = runtime_dir(args.runtime_dir)
    try:
        check_not_running(runtime)
        check_ports(plan)
        prepare_dirs(plan, host.software.tmpfs_path, runtime)
    except LaunchError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return e.code
    root = config_root(args.config_root)
    inputs = PlanInputs(
        host, root, args.profile, tuple(args.overrides), tuple(args.sets), args.model, args.draft
    )  # the same inputs for every re-plan: degrade steps, the memory ladder, reloads
    setup_logging(runtime, to_stderr=True)
    return run_daemon(
        plan, inputs.replan, rel, vllm_command(None), host.software.numactl_path, host.software.tmpfs_path, runtime,
        watch_root=Path(root) if args.watch_config and root else None, watch_quiet_s=args.watch_quiet,
        min_model_len=inputs.min_model_len(),
    )  # fmt: skip


def cmd_watch(args: argparse.Namespace) -> int:
    from ..daemon.watchcmd import run_watch

    if args.interval is not None and not (0.05 <= args.interval <= 3600):
        raise CliError("--interval must be between 0.05 and 3600 seconds", EXIT_USAGE)
    return run_watch(args.url, _watch_settings(args), args.once, args.json, args.interval, args.draft_cost, args.max_num_seqs)


def _watch_settings(args: argparse.Namespace):  # -> Watch
    """The ``watch`` settings of the profile this host matches (and the command's overrides)."""
    from ..pipeline import config_root, resolve_settings

    host = load_host(args)
    res = resolve_settings(host, args.config_root or config_root(), args.profile, args.overrides, args.set, None)
    return res.settings.watch


def cmd_install_service(args: argparse.Namespace) -> int:
    from ..service import install

    extra = args.daemon_args[1:] if args.daemon_args[:1] == ["--"] else args.daemon_args
    try:
        lines = install(extra, args.prefix, args.user, args.stop_timeout, args.run_as)
    except OSError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for line in lines:
        print(f"hwprofile: {line}")
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    from ..runtime.dirs import runtime_dir
    from ..service import ReloadError, signal_reload

    try:
        lines = signal_reload(runtime_dir(args.runtime_dir))
    except ReloadError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for line in lines:
        print(f"hwprofile: {line}")
    return EXIT_OK
