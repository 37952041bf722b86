"""Configuration: YAML read with file and line for every value, the settings declared as typed
frozen dataclasses (one default each) with the table and validation derived from them, and the
override layers (built-in profile < /etc profile < overrides.d < --overrides < env < --set), merged
once into :class:`~.settings.Settings`."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import InputError


class Source(NamedTuple):
    """Where a value came from: ``kind`` is builtin, etc-profile, overrides.d, overrides, env, cli,
    or planner; ``file``/``line`` where it has them."""

    kind: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.file and self.line:
            return f"{self.kind} {self.file}:{self.line}"
        if self.file:
            return f"{self.kind} {self.file}"
        return self.kind


class ConfigError(InputError):
    """Invalid user input: one or more problems, each naming the file and line where it can."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    def messages(self) -> list[str]:
        return list(self.problems)
