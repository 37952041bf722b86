"""The host snapshot: a frozen, plain-data picture of one machine.

Records are ``typing.NamedTuple``s: immutable, and cheap to define (a frozen dataclass costs ~1 ms
each to create at import on these machines, a NamedTuple ~0.2 ms; ``detect`` has a 100 ms budget).

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
from typing import TYPE_CHECKING, NamedTuple

from ..errors import InputError

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


class SnapshotError(InputError, ValueError):
    """A saved snapshot that cannot be read; the message says which file and what is wrong."""


def decode_clock_event_reasons(mask: int | None) -> tuple[str, ...] | None:
    if mask is None:
        return None
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return tuple(names)


class PcieLink(NamedTuple):
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


class Gpu(NamedTuple):
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pci_device_id: str | None = None
    minor_number: int | None = None  # N of /dev/nvidiaN (NVML index != minor); None = unknown
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


class GpuLink(NamedTuple):
    a: int
    b: int
    link: str | None  # NV<n>, PIX, PXB, PHB, NODE, SYS; None when unknown
    p2p: bool | None = None


class NumaNode(NamedTuple):
    id: int
    cpus: str
    memory_bytes: int | None = None


class Cpu(NamedTuple):
    model: str | None = None
    logical_cpus: int | None = None
    sockets: int | None = None
    flags: tuple[str, ...] = ()


class Driver(NamedTuple):
    version: str | None = None
    cuda_version: str | None = None
    nvml_library: str | None = None


class Software(NamedTuple):
    vllm_version: str | None = None
    vllm_distribution: str | None = None
    numactl_path: str | None = None
    tmpfs_path: str | None = None
    tmpfs_free_bytes: int | None = None


class DetectError(NamedTuple):
    where: str
    message: str


class HostSnapshot(NamedTuple):
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
        except _Bad as e:
            raise SnapshotError(f"{source}: not a valid host snapshot: {e}") from None
        try:
            return _build(cls, data)
        except (TypeError, ValueError, KeyError) as e:
            raise SnapshotError(f"{source}: not a valid host snapshot: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HostSnapshot:
        """Read a saved snapshot (``-`` = standard input): at most :data:`MAX_SNAPSHOT_BYTES`,
        UTF-8, strict JSON (no duplicate keys, NaN or Infinity), then :meth:`from_dict`."""
        try:
            raw = read_capped(path, MAX_SNAPSHOT_BYTES)
        except OSError as e:
            raise SnapshotError(f"{path}: cannot read snapshot: {e.strerror or e}") from None
        if len(raw) > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(
                f"{path}: larger than {MAX_SNAPSHOT_BYTES >> 20} MiB: not a host snapshot "
                "(save one with `hwprofile detect --json > FILE`)"
            )
        if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors write
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SnapshotError(
                f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                "save it again with `hwprofile detect --json > FILE`"
            ) from None
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        except _Bad as e:
            raise SnapshotError(f"{path}: invalid JSON: {e}") from None
        except RecursionError:
            raise SnapshotError(f"{path}: invalid JSON: nested too deeply") from None
        except ValueError as e:  # e.g. an integer of more than 4300 digits
            raise SnapshotError(f"{path}: invalid JSON: {e}") from None
        return cls.from_dict(data, source=str(path))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Bad(f"key {json.dumps(dup)}", "appears twice in one object")
    return out


def _no_constant(name: str) -> Any:
    raise _Bad(name, "not a JSON number (NaN and Infinity are not allowed)")


def read_capped(path: str | os.PathLike[str], cap: int) -> bytes:
    """The bytes of ``path`` (``-`` = standard input), at most ``cap + 1`` of them (more means too big)."""
    if os.fspath(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream put in place of stdin (tests)
            return sys.stdin.read(cap + 1).encode("utf-8", "surrogateescape")
        return stream.read(cap + 1)
    with open(path, "rb") as f:
        return f.read(cap + 1)


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


# -- the hwprofile.host/1 contract ---------------------------------------------------------------
#
# One table (``_HOST``) says what every field may hold; ``_check`` walks a parsed snapshot against
# it and ``json_schema()`` publishes the same table as JSON Schema (schemas/hwprofile.host-1.schema.json,
# kept equal by a test). Then ``_consistency`` checks what JSON Schema cannot say: unique GPU indexes,
# device minors and NUMA node ids, links between existing GPUs, GPUs on listed NUMA nodes, used ≤ total
# memory.
# Plain Python, no imports: a snapshot of eight GPUs checks in well under a millisecond.

MAX_SNAPSHOT_BYTES = 4 << 20  # a snapshot of 256 GPUs is ~1 MB; anything larger is not one
_TIB = 1 << 40
_PIB = 1 << 50
MAX_GPUS = 256
MAX_DEVICE_MINOR = 255  # /dev/nvidia<minor> is a char device of major 195, minors 0-255
MAX_CPUS = 16384
MAX_NUMA_NODES = 1024
_CONTROL = "".join(map(chr, range(32))) + "\x7f"
_CONTROL_CHAR = "[\\u0000-\\u001f\\u007f]"
_CPULIST = "^([0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*)?$"


class _Bad(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    text = json.dumps(v, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


class _Kind:
    """One field's rule: ``valid(value)`` is the fast answer; ``check(value, path)`` (run only when
    that is no) raises :class:`_Bad` with the path of the first bad value; ``schema()`` is the
    rule as JSON Schema."""

    null = False

    def valid(self, v: Any) -> bool:
        return (v is None and self.null) or self.ok(v)

    def what(self) -> str:
        raise NotImplementedError

    def ok(self, v: Any) -> bool:
        raise NotImplementedError

    def check(self, v: Any, path: str) -> None:
        if v is None and self.null:
            return
        if not self.ok(v):
            self.fail(v, path)

    def fail(self, v: Any, path: str) -> None:
        raise _Bad(path, f"expected {self.what()}{' or null' if self.null else ''}, got {_show(v)}")

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def typed(self, t: str) -> dict[str, Any]:
        return {"type": [t, "null"] if self.null else t}


class _Int(_Kind):
    def __init__(self, lo: int, hi: int, null: bool = True, unit: str = "") -> None:
        self.lo, self.hi, self.null, self.unit = lo, hi, null, unit

    def what(self) -> str:
        return f"an integer from {self.lo} to {self.hi}{self.unit}"

    def ok(self, v: Any) -> bool:
        return type(v) is int and self.lo <= v <= self.hi

    def schema(self) -> dict[str, Any]:
        return {**self.typed("integer"), "minimum": self.lo, "maximum": self.hi}


class _Num(_Int):
    def what(self) -> str:
        return f"a number from {self.lo} to {self.hi}{self.unit}"

    def ok(self, v: Any) -> bool:
        return type(v) in (int, float) and self.lo <= v <= self.hi  # NaN fails both comparisons

    def schema(self) -> dict[str, Any]:
        return {**self.typed("number"), "minimum": self.lo, "maximum": self.hi}


class _Bool(_Kind):
    def __init__(self, null: bool = False) -> None:
        self.null = null

    def what(self) -> str:
        return "true/false"

    def ok(self, v: Any) -> bool:
        return type(v) is bool

    def schema(self) -> dict[str, Any]:
        return self.typed("boolean")


class _Str(_Kind):
    """Text of at most ``max_len`` characters, no control characters (they end up in file names,
    environment files and command lines) unless ``lines``; ``pattern`` (a regular expression,
    anchored) and ``like`` (what it says in an error) narrow it further."""

    def __init__(
        self, max_len: int, null: bool = True, pattern: str | None = None, like: str = "", lines: bool = False
    ) -> None:
        self.max_len, self.null, self.pattern, self.like, self.lines = max_len, null, pattern, like, lines
        self._rx: Any = None

    def what(self) -> str:
        if self.like:
            return self.like
        return f"a string of at most {self.max_len} characters{'' if self.lines else ' without control characters'}"

    def ok(self, v: Any) -> bool:
        if type(v) is not str or len(v) > self.max_len:
            return False
        if not v.isprintable():  # rare: control characters, surrogates, unusual spaces
            try:
                v.encode("utf-8")  # a lone surrogate (from a "\\udc80" escape) cannot be printed
            except UnicodeEncodeError:
                return False
            if self.lines:
                return "\x00" not in v
            if v.translate(_STRIP_CONTROL) != v:
                return False
        if self.pattern is None:
            return True
        if self._rx is None:
            import re

            self._rx = re.compile(self.pattern)
        return self._rx.fullmatch(v) is not None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.typed("string"), "maxLength": self.max_len}
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        if not self.lines:  # also what "$" lets through before a final newline
            out["not"] = {"type": "string", "pattern": _CONTROL_CHAR}
        return out


_STRIP_CONTROL = {ord(c): None for c in _CONTROL}


class _List(_Kind):
    def __init__(self, item: _Kind, max_items: int, null: bool = False) -> None:
        self.item, self.max_items, self.null = item, max_items, null

    def what(self) -> str:
        return f"a list of at most {self.max_items} items"

    def ok(self, v: Any) -> bool:
        return type(v) is list and len(v) <= self.max_items

    def valid(self, v: Any) -> bool:
        if v is None:
            return self.null
        if not self.ok(v):
            return False
        item = self.item
        return all(item.valid(x) for x in v)

    def check(self, v: Any, path: str) -> None:
        super().check(v, path)
        if v is not None:
            for i, x in enumerate(v):
                self.item.check(x, f"{path}[{i}]")

    def schema(self) -> dict[str, Any]:
        return {**self.typed("array"), "maxItems": self.max_items, "items": self.item.schema()}


class _Obj(_Kind):
    """An object with these fields; ``required`` ones must be there; other keys are ignored
    (a newer writer may add some)."""

    def __init__(self, fields: dict[str, _Kind], required: tuple[str, ...] = (), doc: str = "") -> None:
        self.fields, self.required, self.doc = fields, required, doc

    def what(self) -> str:
        return "an object"

    def ok(self, v: Any) -> bool:
        return type(v) is dict

    def valid(self, v: Any) -> bool:
        if type(v) is not dict:
            return False
        for name in self.required:
            if name not in v:
                return False
        return all(kind.valid(v[name]) for name, kind in self.fields.items() if name in v)

    def check(self, v: Any, path: str) -> None:
        super().check(v, path)
        prefix = f"{path}." if path else ""
        for name in self.required:
            if name not in v:
                raise _Bad(f"{prefix}{name}", "required, missing")
        for name, kind in self.fields.items():
            if name in v:
                kind.check(v[name], prefix + name)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.doc:
            out["description"] = self.doc
        out["properties"] = {k: f.schema() for k, f in self.fields.items()}
        if self.required:
            out["required"] = list(self.required)
        return out


class _Const(_Kind):
    def __init__(self, value: str) -> None:
        self.value = value

    def what(self) -> str:
        return json.dumps(self.value)

    def ok(self, v: Any) -> bool:
        return v == self.value and type(v) is str

    def schema(self) -> dict[str, Any]:
        return {"const": self.value}


_LINK = "NV([1-9][0-9]?)|PIX|PXB|PHB|NODE|SYS"
_PATH = _Str(4096, pattern="/[^\\u0000-\\u001f\\u007f]*", like="an absolute path without control characters")
_VERSION = _Str(64, pattern="[0-9A-Za-z][0-9A-Za-z.+_!-]*", like="a version string like 0.11.0")

_HOST = _Obj(
    {
        "schema": _Const(SCHEMA),
        "hostname": _Str(253),
        "kernel": _Str(256),
        "cpu": _Obj(
            {
                "model": _Str(256),
                "logical_cpus": _Int(1, MAX_CPUS),
                "sockets": _Int(1, 1024),
                "flags": _List(_Str(64, null=False, pattern="[A-Za-z0-9_.-]+", like="a CPU flag name"), 4096),
            }
        ),
        "memory_bytes": _Int(0, _PIB, unit=" (1 PiB)"),
        "numa_nodes": _List(
            _Obj(
                {
                    "id": _Int(0, MAX_NUMA_NODES - 1, null=False),
                    "cpus": _Str(65536, null=False, pattern=_CPULIST, like='a CPU list like "0-27,56-83"'),
                    "memory_bytes": _Int(0, _PIB, unit=" (1 PiB)"),
                },
                required=("id", "cpus"),
            ),
            MAX_NUMA_NODES,
        ),
        "gpus": _List(
            _Obj(
                {
                    "index": _Int(0, MAX_GPUS - 1, null=False),
                    "name": _Str(256),
                    "uuid": _Str(128),
                    "pci_bus_id": _Str(
                        32,
                        pattern="[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\\.[0-7]",
                        like='a PCI bus id like "00000000:21:00.0"',
                    ),
                    "pci_device_id": _Str(
                        10, pattern="0x[0-9A-Fa-f]{8}", like='a PCI device id like "0x268410de"'
                    ),
                    "minor_number": _Int(0, MAX_DEVICE_MINOR),
                    "memory_total_bytes": _Int(0, _TIB, unit=" (1 TiB)"),
                    "memory_used_bytes": _Int(0, _TIB, unit=" (1 TiB)"),
                    "memory_reserved_bytes": _Int(0, _TIB, unit=" (1 TiB)"),
                    "compute_capability": _Str(
                        5, pattern="[0-9]{1,2}\\.[0-9]{1,2}", like='a string like "8.9"'
                    ),
                    "numa_node": _Int(0, MAX_NUMA_NODES - 1),
                    "numa_node_source": _Str(
                        16,
                        pattern="nvml|sysfs|only_node|cpu_affinity",
                        like="nvml, sysfs, only_node or cpu_affinity",
                    ),
                    "cpu_affinity": _Str(65536, pattern=_CPULIST, like='a CPU list like "0-27,56-83"'),
                    "pcie": _Obj(
                        {
                            "gen": _Int(1, 16),
                            "width": _Int(1, 64),
                            "max_gen": _Int(1, 16),
                            "max_width": _Int(1, 64),
                            "degraded": _Bool(null=True),
                        }
                    ),
                    "nvlink_active_links": _Int(0, 64),
                    "power_limit_watts": _Num(0, 10000, unit=" W"),
                    "power_draw_watts": _Num(0, 10000, unit=" W"),
                    "temperature_c": _Int(-50, 150, unit=" °C"),
                    "temperature_slowdown_c": _Int(-50, 150, unit=" °C"),
                    "temperature_shutdown_c": _Int(-50, 150, unit=" °C"),
                    "sm_clock_mhz": _Int(0, 10000, unit=" MHz"),
                    "sm_clock_max_mhz": _Int(0, 10000, unit=" MHz"),
                    "clocks_event_reasons": _List(
                        _Str(64, null=False, pattern="[a-z0-9_]+", like="a reason name like sw_power_cap"),
                        64,
                        null=True,
                    ),
                    "clocks_event_reasons_mask": _Int(0, 2**64 - 1),
                    "lost": _Bool(),
                },
                required=("index",),
            ),
            MAX_GPUS,
        ),
        "gpu_links": _List(
            _Obj(
                {
                    "a": _Int(0, MAX_GPUS - 1, null=False),
                    "b": _Int(0, MAX_GPUS - 1, null=False),
                    "link": _Str(8, pattern=_LINK, like="NV<n>, PIX, PXB, PHB, NODE or SYS"),
                    "p2p": _Bool(null=True),
                },
                required=("a", "b", "link"),
            ),
            MAX_GPUS * (MAX_GPUS - 1) // 2,
        ),
        "driver": _Obj({"version": _VERSION, "cuda_version": _VERSION, "nvml_library": _PATH}),
        "software": _Obj(
            {
                "vllm_version": _VERSION,
                "vllm_distribution": _Str(
                    128, pattern="[A-Za-z0-9][A-Za-z0-9._-]*", like="a distribution name"
                ),
                "numactl_path": _PATH,
                "tmpfs_path": _PATH,
                "tmpfs_free_bytes": _Int(0, _PIB, unit=" (1 PiB)"),
            }
        ),
        "errors": _List(
            _Obj(
                {"where": _Str(256, null=False), "message": _Str(4096, null=False, lines=True)},
                required=("where", "message"),
            ),
            10000,
        ),
    },
    required=("schema",),
)


def _consistency(data: dict[str, Any]) -> None:
    """What the per-field rules cannot see: the snapshot's parts must agree with each other."""
    node_ids: set[int] = set()
    seen_cpus: dict[int, int] = {}
    for i, n in enumerate(data.get("numa_nodes", ())):
        if n["id"] in node_ids:
            raise _Bad(f"numa_nodes[{i}].id", f"NUMA node {n['id']} is listed twice")
        node_ids.add(n["id"])
        for part in filter(None, n["cpus"].split(",")):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first or last >= MAX_CPUS:
                raise _Bad(f"numa_nodes[{i}].cpus", f"bad CPU range {part!r} (CPUs are 0 to {MAX_CPUS - 1})")
            for c in range(first, last + 1):
                if seen_cpus.setdefault(c, n["id"]) != n["id"]:
                    raise _Bad(f"numa_nodes[{i}].cpus", f"CPU {c} is also on NUMA node {seen_cpus[c]}")
    indexes: set[int] = set()
    minors: dict[int, int] = {}
    for i, g in enumerate(data.get("gpus", ())):
        w = f"gpus[{i}]"
        if g["index"] in indexes:
            raise _Bad(f"{w}.index", f"GPU index {g['index']} is listed twice")
        indexes.add(g["index"])
        minor = g.get("minor_number")
        if minor is not None:
            if minor in minors:
                raise _Bad(
                    f"{w}.minor_number",
                    f"device minor {minor} is also GPU {minors[minor]}'s (/dev/nvidia{minor})",
                )
            minors[minor] = g["index"]
        node = g.get("numa_node")
        if node is not None and node_ids and node not in node_ids:
            raise _Bad(f"{w}.numa_node", f"NUMA node {node} is not in numa_nodes (ids {sorted(node_ids)})")
        aff = g.get("cpu_affinity")
        for part in filter(None, (aff or "").split(",")):
            lo, _, hi = part.partition("-")
            if int(hi or lo) < int(lo) or int(hi or lo) >= MAX_CPUS:
                raise _Bad(f"{w}.cpu_affinity", f"bad CPU range {part!r} (CPUs are 0 to {MAX_CPUS - 1})")
        total = g.get("memory_total_bytes")
        for k in ("memory_used_bytes", "memory_reserved_bytes"):
            v = g.get(k)
            if v is not None and total is not None and v > total:
                raise _Bad(f"{w}.{k}", f"{v} is more than memory_total_bytes ({total})")
        pcie = g.get("pcie") or {}
        for cur, top in (("gen", "max_gen"), ("width", "max_width")):
            if pcie.get(cur) is not None and pcie.get(top) is not None and pcie[cur] > pcie[top]:
                raise _Bad(f"{w}.pcie.{cur}", f"{pcie[cur]} is above pcie.{top} ({pcie[top]})")
    pairs: set[frozenset[int]] = set()
    for i, lk in enumerate(data.get("gpu_links", ())):
        for end in ("a", "b"):
            if lk[end] not in indexes:
                raise _Bad(f"gpu_links[{i}].{end}", f"no GPU with index {lk[end]} in gpus")
        if lk["a"] == lk["b"]:
            raise _Bad(f"gpu_links[{i}]", f"links GPU {lk['a']} to itself")
        pair = frozenset((lk["a"], lk["b"]))
        if pair in pairs:
            raise _Bad(f"gpu_links[{i}]", f"GPUs {lk['a']} and {lk['b']} are linked twice")
        pairs.add(pair)


def validate(data: Any) -> None:
    """Raise :class:`_Bad` (with the JSON path) unless ``data`` is a valid ``hwprofile.host/1`` snapshot."""
    if not _HOST.valid(data):
        _HOST.check(data, "")  # finds the path of the first bad value and raises
        raise _Bad("snapshot", "not valid")  # unreachable while valid() and check() agree
    _consistency(data)


def json_schema() -> dict[str, Any]:
    """The contract as JSON Schema (draft 2020-12); cross-field rules are in its description."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/hwprofile/hwprofile/schemas/hwprofile.host-1.schema.json",
        "title": "hwprofile host snapshot (hwprofile.host/1)",
        "description": (
            "What `hwprofile detect --json` prints and `--from FILE` reads. Unknown values are null; "
            "keys not listed here are ignored. Also checked at load, beyond this schema: integers are "
            "JSON integers (not 1.0); GPU indexes and NUMA node ids are unique; gpu_links name existing, "
            "distinct GPUs, each pair once; no two GPUs share a minor_number; a GPU's numa_node is one of numa_nodes' ids (when any are "
            "listed); no CPU is on two NUMA nodes; CPU ranges ascend and stay below "
            f"{MAX_CPUS}; memory used and reserved are at most the total; PCIe gen and width are at "
            f"most their maximum; the file is UTF-8, at most {MAX_SNAPSHOT_BYTES} bytes, without "
            "duplicate keys, NaN, Infinity or lone surrogates (\\udc80) in strings."
        ),
        **_HOST.schema(),
    }
