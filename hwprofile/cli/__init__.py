"""Command-line interface. Kept light: no vLLM or torch import on any path here.

- :mod:`.parser`: the argparse tree (one builder per command, shared option groups);
- :mod:`.host`: ``detect``, ``profiles``, ``doctor``;
- :mod:`.planning`: ``plan``, ``render``;
- :mod:`.running`: ``launch``, ``status``, ``stop``, ``daemon``, ``watch``, ``reload``, ``install-service``;
- :mod:`.bench`: ``bench``; :mod:`.verify`: ``verify``;
- :mod:`.common`: what they share (:class:`CliError`, the host snapshot, the plan and its inputs,
  the launch of a plan);
- :mod:`.views`: the human-readable views (formatting only); :mod:`.doctor`: ``doctor``'s checks
  and ``--fix``.

:func:`main` holds the one handler that turns a :class:`hwprofile.errors.HwprofileError` into its
exit code and its report on stderr; no command catches its own; :func:`run` is the console script.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import EXIT_FAILED, EXIT_OK, HwprofileError
from .common import CliError
from .parser import _commands, build_parser

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["CliError", "_commands", "build_parser", "main", "run"]


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
        for line in e.report():
            print(line, file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        import errno

        if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENXIO) and (
            e.filename
        ):  # a path of the host's that is not what it must be (a file in a directory's place...)
            print(f"hwprofile: error: {e.filename}: {e.strerror}", file=sys.stderr)
            return EXIT_FAILED
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise
        print(f"hwprofile: error: cannot write the output: {e.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


# Commands that build their data once, print and exit. Almost nothing they allocate is garbage before
# the exit, so the cyclic collector's passes only walk live objects again and again (~10 % of `plan`'s
# CPU at start-up, benchmarks/bench_plan.py): for these its first generation is collected rarely.
# The commands that keep running (launch, daemon, watch, bench, verify) keep the default thresholds.
ONE_SHOT = frozenset(
    {"detect", "profiles", "plan", "render", "status", "stop", "doctor", "reload", "install-service"}
)
LONG_RUNNING = frozenset({"launch", "daemon", "watch", "bench", "verify"})
ONE_SHOT_GC_THRESHOLD = 50_000


def run() -> int:
    """The console script (``sys.exit(run())``): ``main``, then the output flushed here, where a
    failure can still be reported. A reader that left (``| head``) is not an error, as in ``main``;
    a full disk is (exit 1). Either way stdout then points at /dev/null, so the interpreter's own
    flush at exit finds nothing left to fail on. Then, after a one-shot command, every object left
    is frozen: the process ends, so the collector's pass over all of them at the interpreter's exit
    is skipped (their memory is the kernel's to take back). The rule that makes this safe: a file is
    closed by the code that opened it (``with``), never left to the collector (a buffered file
    reachable only from a cycle would not be flushed). Not after the others: they may have loaded
    torch (the demo's tiny model), whose nanobind extensions report the objects they find left at
    the exit as leaks."""
    import gc
    import os

    one_shot = bool(sys.argv[1:2]) and sys.argv[1] in ONE_SHOT
    if one_shot:
        gc.set_threshold(ONE_SHOT_GC_THRESHOLD, *gc.get_threshold()[1:])
    code = main()
    try:
        sys.stdout.flush()
    except OSError as e:
        if not isinstance(e, BrokenPipeError):
            print(f"hwprofile: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
            code = code or EXIT_FAILED
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if one_shot:
        gc.freeze()
    return code
