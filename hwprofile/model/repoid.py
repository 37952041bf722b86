"""Hugging Face repository names and revisions as the Hub spells them (``ORG/NAME``, ``NAME@REV``, a
40-hex commit): what telling a Hub name from a directory or a catalog name needs, apart from
:mod:`.hub` (which reaches the network), so that resolving a local model does not load it."""

from __future__ import annotations

import re

from ..config import ConfigError

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
COMMIT = re.compile(r"[0-9a-f]{40}")


def is_repo_id(name: str) -> bool:
    """``ORG/NAME`` as the Hub spells repository names (no path, no scheme)."""
    return bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name


def split_revision(spec: str) -> tuple[str, str | None]:
    """``NAME@REV`` → ``(NAME, REV)``; a spec without ``@`` has no revision."""
    name, at, rev = spec.partition("@")
    if not at:
        return spec, None
    if not rev or not _REVISION.fullmatch(rev) or ".." in rev.split("/") or rev.endswith("/"):
        raise ConfigError(
            f"{spec!r}: the revision after '@' must be a branch, a tag or a commit (e.g. main, v1.0, "
            "refs/pr/1, a 40-hex commit)"
        )
    return name, rev
