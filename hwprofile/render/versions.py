"""Which flags, choices and speculative-config keys each vLLM release accepts (package data read off
each release's own ``vllm serve`` parser, 0.6.3 ... 0.33.0)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import InputError


class UnknownVersion(InputError, ValueError):
    pass


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` → ``(0, 32, 0)``; ``"0.10.1.post1"`` → ``(0, 10, 1)``."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise UnknownVersion(f"'{text}' is not a vLLM version (expected e.g. 0.11.0)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return json.loads((Path(__file__).resolve().parent.parent / "data" / "vllm.json").read_text())


class Release(NamedTuple):
    """The table of one release, chosen for a (maybe newer or in-between) target version."""

    target: str  # the version asked for
    table: str  # the release whose table is used
    note: str | None  # why they differ, if they do

    @property
    def v(self) -> tuple[int, int, int]:
        return parse_version(self.table)

    def has(self, flag: str) -> bool:
        return flag in _data()["options"][self.table]

    def choices(self, flag: str) -> list[str] | None:
        """Values this release accepts for ``flag`` (enforced by argparse or checked by the engine)."""
        values = _data()["values"].get(flag, {}).get(self.table)
        if values is not None:
            return list(values)
        opt = _data()["options"][self.table].get(flag)
        return list(opt) if isinstance(opt, list) else None

    def spec_table(self) -> dict[str, Any]:
        """What this release does with speculative decoding: ``--speculative-config`` keys and
        methods, whether unknown keys are rejected, which load-protection and vocabulary options
        it honours, its refusals (tools/build_vllm_table.py derives it from the shared facts)."""
        return _data()["speculative"][self.table]

    def options(self) -> dict[str, Any]:
        return dict(_data()["options"][self.table])


def known_versions() -> list[str]:
    return list(_data()["versions"])


def release(target: str) -> Release:
    """The table for ``target``: its own, else the nearest older release's (flags are only ever
    added or removed at releases, so the older table is the safe choice)."""
    want = parse_version(target)
    versions = sorted(known_versions(), key=parse_version)
    exact = [v for v in versions if parse_version(v) == want]
    if exact:
        return Release(target, exact[0], None)
    older = [v for v in versions if parse_version(v) < want]
    if not older:
        raise UnknownVersion(
            f"vLLM {target} is older than the oldest release hwprofile knows ({versions[0]})"
        )
    table = older[-1]
    return Release(
        target, table, f"no flag table for vLLM {target}; using {table}'s, the nearest older release"
    )
