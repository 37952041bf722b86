"""Command-line interface. Kept light: no vLLM or torch import on any path here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__

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
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"hwprofile: error: {e}", file=sys.stderr)
        return e.code
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
