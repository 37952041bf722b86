"""The host snapshot: a frozen, plain-data picture of one machine.

Records are ``NamedTuple``s (:class:`hwprofile._record.Record`): immutable, cheap to define (the
CLI's start-up time matters: a frozen dataclass costs ~1 ms each to create at import on these
machines, a NamedTuple ~0.2 ms, and this module imports neither ``typing`` nor ``pathlib``).

Detection (``hwprofile.detect``) is the only code that produces it from the live host; everything
downstream (matching, planning, rendering) reads only this. It serialises to JSON under the schema
``hwprofile.host/1`` and loads back unchanged, so a snapshot can be saved on one machine and replayed
on another (``--from FILE``).

Unknown values are ``None``; what could not be read, and why, is listed in ``errors``.
"""

from __future__ import annotations

import json
import os
import sys

from ._record import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Any

SCHEMA = "hwprofile.host/1"

# Clock-event (throttle) reason bits, as in nvml.h (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# Link vocabulary of ``nvidia-smi topo -m``, best first.
LINK_KINDS = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")


class SnapshotError(ValueError):
    """A saved snapshot that cannot be read; the message says which file and what is wrong."""


def decode_clock_event_reasons(mask: int | None) -> tuple[str, ...] | None:
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return tuple(names)


class PcieLink(Record):
    gen: int | None = None
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None

    @property
    def degraded(self) -> bool:
        """True when the link trained below the width or generation the board supports."""
        return (self.width is not None and self.max_width is not None and self.width < self.max_width) or (
            self.gen is not None and self.max_gen is not None and self.gen < self.max_gen
        )


class Gpu(Record):
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # set aside by the driver (NVML memory v2)
    compute_capability: str | None = None
    numa_node: int | None = None
    numa_node_source: str | None = None  # "nvml" or "sysfs"
    cpu_affinity: str | None = None
    pcie: PcieLink = PcieLink()
    nvlink_active_links: int | None = None
    power_limit_watts: float | None = None
    power_draw_watts: float | None = None
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    temperature_shutdown_c: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    clocks_event_reasons: tuple[str, ...] | None = None
    clocks_event_reasons_mask: int | None = None
    lost: bool = False

    @property
    def memory_total_gib(self) -> float | None:
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 2**30


class GpuLink(Record):
    a: int
    b: int
    link: str | None  # NV<n>, PIX, PXB, PHB, NODE, SYS; None when unknown
    p2p: bool | None = None


class NumaNode(Record):
    id: int
    cpus: str
    memory_bytes: int | None = None


class Cpu(Record):
    model: str | None = None
    logical_cpus: int | None = None
    sockets: int | None = None
    flags: tuple[str, ...] = ()


class Driver(Record):
    version: str | None = None
    cuda_version: str | None = None
    nvml_library: str | None = None


class Software(Record):
    vllm_version: str | None = None
    vllm_distribution: str | None = None
    numactl_path: str | None = None
    tmpfs_path: str | None = None
    tmpfs_free_bytes: int | None = None


class DetectError(Record):
    where: str
    message: str


class HostSnapshot(Record):
    hostname: str | None = None
    kernel: str | None = None
    cpu: Cpu = Cpu()
    memory_bytes: int | None = None
    numa_nodes: tuple[NumaNode, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    gpu_links: tuple[GpuLink, ...] = ()
    driver: Driver = Driver()
    software: Software = Software()
    errors: tuple[DetectError, ...] = ()
    schema: str = SCHEMA

    # -- derived facts, for matching and planning ---------------------------------------------
    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if not g.lost)

    def link(self, a: int, b: int) -> GpuLink | None:
        for lk in self.gpu_links:
            if {lk.a, lk.b} == {a, b}:
                return lk
        return None

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = _plain(self)
        out: dict[str, Any] = {"schema": d.pop("schema")}
        out.update(d)
        for g, gd in zip(self.gpus, out["gpus"], strict=True):
            gd["pcie"]["degraded"] = g.pcie.degraded
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<snapshot>") -> HostSnapshot:
        if not isinstance(data, dict):
            raise SnapshotError(f"{source}: expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise SnapshotError(
                f"{source}: schema is {schema!r}, expected {SCHEMA!r} "
                "(save it again with `hwprofile detect --json > FILE`)"
            )
        try:
            return _build(cls, data)
        except (TypeError, ValueError, KeyError) as e:
            raise SnapshotError(f"{source}: not a valid host snapshot: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HostSnapshot:
        try:
            text = sys_stdin_or_file(path)
        except OSError as e:
            raise SnapshotError(f"{path}: cannot read snapshot: {e.strerror or e}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        return cls.from_dict(data, source=str(path))


def sys_stdin_or_file(path: str | os.PathLike[str]) -> str:
    """Read a snapshot file; ``-`` reads standard input."""
    if os.fspath(path) == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _plain(obj: Any) -> Any:
    """Records → dicts, tuples → lists, recursively (JSON-ready)."""
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


_NESTED: dict[str, type] = {
    "cpu": Cpu,
    "driver": Driver,
    "software": Software,
    "pcie": PcieLink,
}
_SEQUENCES: dict[str, type] = {
    "numa_nodes": NumaNode,
    "gpus": Gpu,
    "gpu_links": GpuLink,
    "errors": DetectError,
}


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Build record ``cls`` from ``data``: unknown keys are ignored (newer writers may add some)."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for name in cls._fields:  # type: ignore[attr-defined]
        if name not in data:
            continue
        v = data[name]
        if name in _NESTED and v is not None:
            v = _build(_NESTED[name], v)
        elif name in _SEQUENCES:
            v = tuple(_build(_SEQUENCES[name], x) for x in (v or ()))
        elif name in ("flags", "clocks_event_reasons") and v is not None:
            v = tuple(v)
        kwargs[name] = v
    return cls(**kwargs)
