"""Reading a saved host snapshot back: the capped, strict JSON reader (``--from FILE``), then the
``hwprofile.host/1`` checks (:mod:`.snapshot_check`) and the records built from checked data.

Reads files (or standard input); it stands above the records it builds, and detection never imports it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..contracts import BadJson, Invalid, parse_json
from .snapshot import (
    MAX_SNAPSHOT_BYTES,
    SCHEMA,
    AcsPort,
    Cpu,
    DetectError,
    Driver,
    Gpu,
    GpuLink,
    HostSnapshot,
    Interconnect,
    NumaNode,
    PcieLink,
    SnapshotError,
    Software,
    VllmP2p,
)
from .snapshot_check import validate


def snapshot_from_dict(data: dict[str, Any], source: str = "<snapshot>") -> HostSnapshot:
    """Check ``data`` against the ``hwprofile.host/1`` contract, then build the snapshot; any
    problem is a :class:`SnapshotError` naming ``source`` and the JSON path of the value."""
    if not isinstance(data, dict):
        raise SnapshotError(f"{source}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA or type(schema) is not str:
        raise SnapshotError(
            f"{source}: schema is {schema!r}, expected {SCHEMA!r} "
            "(save it again with `hwprofile detect --json > FILE`)"
        )
    try:
        validate(data)
    except Invalid as e:
        raise SnapshotError(f"{source}: not a valid host snapshot: {e}") from None
    try:
        return _build(HostSnapshot, data)
    except (TypeError, ValueError, KeyError) as e:
        raise SnapshotError(f"{source}: not a valid host snapshot: {e}") from None


def load_snapshot(path: str | os.PathLike[str]) -> HostSnapshot:
    """A saved snapshot: at most :data:`MAX_SNAPSHOT_BYTES` of ``path`` (``-`` = standard input),
    UTF-8, strict JSON (no duplicate keys, NaN or Infinity), then :func:`snapshot_from_dict`."""
    import errno

    raw = b""
    try:
        raw = read_capped(path, MAX_SNAPSHOT_BYTES)
        too_big = len(raw) > MAX_SNAPSHOT_BYTES  # standard input is read up to one byte more
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise SnapshotError(f"{path}: cannot read snapshot: {e.strerror or e}") from None
        too_big = True
    if too_big:
        raise SnapshotError(
            f"{path}: larger than {MAX_SNAPSHOT_BYTES >> 20} MiB: not a host snapshot "
            "(save one with `hwprofile detect --json > FILE`)"
        )
    try:
        data = parse_json(raw)
    except BadJson as e:
        hint = "; save it again with `hwprofile detect --json > FILE`" if "UTF-8" in e.message else ""
        raise SnapshotError(f"{path}{e.where}: {e.message}{hint}") from None
    return snapshot_from_dict(data, source=str(path))


def read_capped(path: str | os.PathLike[str], cap: int) -> bytes:
    """The bytes of ``path`` (``-`` = standard input), at most ``cap + 1`` of them (more means too big)."""
    if os.fspath(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream put in place of stdin (tests)
            return sys.stdin.read(cap + 1).encode("utf-8", "surrogateescape")
        return stream.read(cap + 1)
    from ..runtime.files import read_bounded

    return read_bounded(path, cap, pipe=True)  # --from <(hwprofile detect --json) is a pipe


_NESTED: dict[str, type] = {
    "cpu": Cpu,
    "driver": Driver,
    "software": Software,
    "pcie": PcieLink,
    "interconnect": Interconnect,
}
_SEQUENCES: dict[str, type] = {
    "numa_nodes": NumaNode,
    "gpus": Gpu,
    "gpu_links": GpuLink,
    "errors": DetectError,
    "acs_ports": AcsPort,
    "vllm_p2p": VllmP2p,
}

# the lists a record holds as tuples ("devices", "allowed", "denied": vLLM's P2P cache files, VllmP2p)
_TUPLES = frozenset(
    {"flags", "clocks_event_reasons", "iommu_units", "gpu_indexes", "moe_configs", "tuned_configs"}
    | {"kernel_packages"}
    | {"devices", "allowed", "denied"}
)


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Build record ``cls`` from ``data``: unknown keys are ignored (newer writers may add some)."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for name in cls._fields:  # type: ignore[attr-defined]  # cls: one of the snapshot's NamedTuples
        if name not in data:
            continue
        v = data[name]
        if name in _NESTED and v is not None:
            v = _build(_NESTED[name], v)
        elif name in _SEQUENCES:
            v = tuple(_build(_SEQUENCES[name], x) for x in (v or ()))
        elif name in _TUPLES and v is not None:
            v = tuple(v)
        kwargs[name] = v
    return cls(**kwargs)
