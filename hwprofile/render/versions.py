"""The renderer's names for vLLM's release facts, which live in :mod:`hwprofile.release` (one home:
planning asks the same :class:`~hwprofile.release.Release`)."""

from __future__ import annotations

from ..release import Release, UnknownVersion, known_versions, parse_version, release

__all__ = ["Release", "UnknownVersion", "known_versions", "parse_version", "release"]
