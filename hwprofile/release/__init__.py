"""vLLM's releases, one home: what each release accepts (its flag table, read off its own parser:
``hwprofile/data/vllm.json``, rebuilt by ``tools/build_vllm_table.py``) and what it does (the named
floors of :mod:`.facts`), as one typed :class:`Release` that planning and rendering both ask.

Adding a release is one entry: its table in ``vllm.json``; a fact "from release X, vLLM does Y" is
one :data:`~.facts.FLOORS` entry and one method of :class:`Release`."""

from .facts import (
    ARCHITECTURES,
    CPU_BUILD,
    FLOORS,
    LAST_SERVING,
    REMOVED,
    Floor,
    Release,
    UnknownVersion,
    Unlisted,
    first_speculative,
    first_where,
    first_with,
    first_with_all,
    first_with_choice,
    floor_of,
    known_versions,
    parse_version,
    release,
    release_of,
    short,
)

__all__ = [
    "ARCHITECTURES",
    "CPU_BUILD",
    "FLOORS",
    "LAST_SERVING",
    "REMOVED",
    "Floor",
    "Release",
    "UnknownVersion",
    "Unlisted",
    "first_speculative",
    "first_where",
    "first_with",
    "first_with_all",
    "first_with_choice",
    "floor_of",
    "known_versions",
    "parse_version",
    "release",
    "release_of",
    "short",
]
