"""What the command modules share: the CLI's own error, the host snapshot of ``--from`` or detection,
the vLLM release to render for, the plan of the command's options (a refusal printed)."""

from __future__ import annotations

import argparse
import sys

from ..errors import EXIT_FAILED, EXIT_USAGE, HwprofileError


class CliError(HwprofileError):
    """A user-facing error of the command line itself, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


def load_host(args: argparse.Namespace):  # -> HostSnapshot
    from ..host.snapshot import HostSnapshot, SnapshotError

    if args.from_file:
        try:
            return HostSnapshot.load(args.from_file)
        except SnapshotError as e:
            raise CliError(str(e)) from None
    from ..host.detect import detect_host

    return detect_host(proc_root=args.proc_root, sys_root=args.sys_root)


def _release(args: argparse.Namespace, host, missing: str):  # -> Release
    """The vLLM release to render for: --vllm-version, else the installed one."""
    from ..render.versions import UnknownVersion, release

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
):  # -> Plan
    """The plan for the command's options, typed; a refusal is printed with what would fit (raises
    _Refused)."""
    from ..config.layers import config_root
    from ..pipeline import make_plan
    from ..plan import PlanRefused

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


# What every `--demo` plans (launch, bench, verify): the tiny model made offline, a short context, a
# small CPU KV space and eager mode; the user's own --set options come after, so they win.
DEMO_SETS = ("engine.max_model_len=512", "cpu.kv_cache_space_gib=0.0625", "engine.enforce_eager=true")


def demo_model(sets: list[str], extra: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """``(model, sets)`` of a ``--demo``: the tiny model (generated on first use) and DEMO_SETS, then
    the command's own ``extra`` defaults, then ``sets``."""
    from ..tinymodel import make_tiny_model

    print("hwprofile: demo: generating a tiny model offline (first run only) ...", file=sys.stderr)
    return str(make_tiny_model()), [*DEMO_SETS, *extra, *sets]
