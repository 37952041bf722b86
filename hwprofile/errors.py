"""Every error hwprofile reports to a person, in one tree, with the exit code in one place.

- :class:`InputError` (exit 2): the input is invalid (a setting, a file, a snapshot, a name);
  nothing was done. The message names the file and line, the JSON path or the key.
- :class:`RefusedError` (exit 1): the input is valid, but what it asks for cannot be done (no plan
  fits this host); the message says what would.
- :class:`OperationError` (exit 1): the host said no while doing it (a write, a launch, a reload).

The CLI (``hwprofile.cli.main``) prints :meth:`HwprofileError.report` on stderr and exits with
:attr:`HwprofileError.exit_code`; no command turns an error into an exit code itself. A refusal to
start a plan (another supervisor, a port taken, no vLLM) is a :class:`RefusedError` like a plan that
does not fit: exit 1 from every command that starts one.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class HwprofileError(Exception):
    exit_code = EXIT_FAILED

    def messages(self) -> list[str]:
        """One line per problem (most errors have one)."""
        return [str(self)]

    def report(self) -> list[str]:
        """The lines a person reads on stderr."""
        return [f"hwprofile: error: {m}" for m in self.messages()]


class InputError(HwprofileError):
    exit_code = EXIT_USAGE


class RefusedError(HwprofileError):
    exit_code = EXIT_FAILED


class OperationError(HwprofileError):
    exit_code = EXIT_FAILED
