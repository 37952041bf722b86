"""The one place that talks to NVML.

Every NVML call goes through :class:`Nvml`, which turns the driver's many ways of failing into data:
a missing library or driver, a function the installed driver lacks (older or newer names are tried
in order), a field the board does not support, a lost GPU. Nothing outside this module imports
``pynvml``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import typing
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, NamedTuple, NewType

from .linux import cpulist_from_masks
from .snapshot import (
    MAX_DEVICE_MINOR,
    DetectError,
    Driver,
    Gpu,
    GpuLink,
    PcieLink,
    decode_clock_event_reasons,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, SupportsInt

# pynvml is untyped: a device handle (``c_nvmlDevice_t``) and an event set (``c_nvmlEventSet_t``) are
# opaque values handed back to the library, never looked into here beyond their address.
NvmlHandle = NewType("NvmlHandle", object)
NvmlEventSet = NewType("NvmlEventSet", object)
# What ``Nvml._n`` is before open(): a module with no functions, so a call finds nothing to call.
_UNOPENED = ModuleType("pynvml (not opened)")

# nvmlGpuTopologyLevel_t → nvidia-smi topo vocabulary.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
# nvmlGpuP2PCapsIndex_t READ. nvidia-ml-py defines NVML_P2P_CAPS_INDEX_READ as the tuple ``(0,)``
# (a trailing comma), which ctypes rejects, so the value from nvml.h is used here.
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_WRITE = 1
P2P_CAPS_INDEX_ATOMICS = 3  # nvml.h: READ 0, WRITE 1, NVLINK 2, ATOMICS 3, PROP 4
NVSWITCH = "nvswitch"  # far end of a link that goes to an NVSwitch
# One NVML call at a time in this process: the daemon's sampler (its main thread) and the start gate
# (each instance's thread, host/gpumem.py) read the same library; NVML is thread-safe, a test's fake
# library re-reading its state file is not.
_CALL_LOCK = threading.RLock()


class GpuLost(Exception):
    """Raised inside this module when a device answers GPU_IS_LOST; the GPU is marked lost."""


class Unavailable(Exception):
    """NVML cannot be used at all on this host (no library, no driver, init failed)."""


NOT_SUPPORTED = "NVML has no value for it here (not supported by this board or driver)"


# The two reading records are NamedTuples, like the snapshot's (host/snapshot.py says why): ``detect``
# imports this module, and ``dataclasses`` (with ``inspect``, ``ast``, ``dis``) would be ~5 ms of its
# start-up for records only the sampler builds.
_NO_WHY: Mapping[str, str] = MappingProxyType({})


class LiveReadings(NamedTuple):
    """One GPU's values that change every tick, as NVML answers them (:meth:`Nvml.live`): each an
    int, or None with its reason in ``why`` (keyed by the field's name): the NVML error, or
    :data:`NOT_SUPPORTED` where the board has no such value, or why it was not asked."""

    temperature: int | None  # °C
    margin: int | None  # °C to the slowdown threshold (NVML's own figure; Ada and later)
    reasons: int | None  # the clock-event reason mask (host/snapshot.py decode_clock_event_reasons)
    sm_clock: int | None  # MHz
    power_draw: int | None  # mW
    power_limit: int | None  # mW, the enforced limit
    memory_used: int | None  # bytes
    why: Mapping[str, str] = _NO_WHY


class FaultCounters(NamedTuple):
    """One GPU's hardware-fault counters (:meth:`Nvml.faults`): each value, or None with its reason in
    ``why`` (a board without ECC answers NOT SUPPORTED: an answer, not a failure)."""

    ecc_uncorrected: int | None  # volatile: since the driver was loaded
    ecc_corrected: int | None
    retired_pending: bool | None  # retired pages pending a reset (before Ampere)
    remap_uncorrectable: int | None  # remapped rows (Ampere and later)
    remap_pending: bool | None
    remap_failure: bool | None
    why: Mapping[str, str] = _NO_WHY

    def values(self) -> tuple[int | bool | None, ...]:
        """Every counter, in field order (``why`` left out)."""
        return (
            self.ecc_uncorrected,
            self.ecc_corrected,
            self.retired_pending,
            self.remap_uncorrectable,
            self.remap_pending,
            self.remap_failure,
        )


class Nvml:
    """An initialised NVML session that records every failure in ``errors``."""

    def __init__(self) -> None:
        self.errors: list[DetectError] = []
        self.library: str | None = None
        self._n: ModuleType = _UNOPENED  # pynvml once open() has loaded it
        self.peers: dict[int, list[str | None]] = {}  # NVLink far ends, filled by gpu()

    # -- life cycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Load the library and initialise NVML, or raise :class:`Unavailable` with the reason."""
        lib = os.environ.get("HWPROFILE_NVML_LIBRARY")
        if lib:
            # A library named by hand is tried in a child first: one that crashes in nvmlInit would
            # otherwise take this process with it, with no word (SIGSEGV).
            crash = probe_library(lib)
            if crash:
                raise Unavailable(crash)
            # Loading by full path first makes pynvml's later CDLL("libnvidia-ml.so.1") reuse it.
            try:
                ctypes.CDLL(lib)
            except OSError as e:
                raise Unavailable(f"HWPROFILE_NVML_LIBRARY={lib} cannot be loaded: {e}") from None
        import pynvml

        self._n = pynvml
        try:
            with _CALL_LOCK:
                pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise Unavailable(_describe_init_error(pynvml, e)) from None
        loaded = _loaded_path(pynvml)
        self.library = loaded or lib
        if lib and loaded and os.path.realpath(loaded) != os.path.realpath(lib):
            # pynvml opens "libnvidia-ml.so.1" by name: a library whose soname is another one was
            # loaded beside it, not used; what NVML answers is the default library's, and is said so
            self.errors.append(
                DetectError(
                    "driver.nvml_library",
                    f"HWPROFILE_NVML_LIBRARY={lib} is not what pynvml uses ({loaded} is): its soname is not "
                    "libnvidia-ml.so.1",
                )
            )

    def close(self) -> None:
        if self._n is not _UNOPENED:
            with contextlib.suppress(self._n.NVMLError), _CALL_LOCK:
                self._n.nvmlShutdown()

    # -- the chokepoint ---------------------------------------------------------------------
    def call(self, where: str, names: str | Sequence[str], *args: object, quiet: bool = False) -> Any:
        """Call the first of ``names`` that this driver has; return ``None`` on failure.

        ``GPU_IS_LOST`` raises :class:`GpuLost`. Other failures are recorded in ``errors`` unless
        ``quiet`` (used where NOT_SUPPORTED is an answer, e.g. NVLink on a GeForce board).
        """
        n = self._n
        candidates = [names] if isinstance(names, str) else list(names)
        last = ""
        for name in candidates:
            fn: Callable[..., Any] | None = getattr(n, name, None)
            if fn is None:
                last = f"{name}: not in this nvidia-ml-py"
                continue
            try:
                with _CALL_LOCK:
                    return fn(*args)
            except n.NVMLError_FunctionNotFound:
                last = f"{name}: the installed driver does not have this function"
                continue
            except n.NVMLError_GpuIsLost:
                raise GpuLost(where) from None
            except n.NVMLError as e:
                if not quiet:
                    self.errors.append(DetectError(where, f"{name}: {_err_text(n, e)}"))
                return None
            except n.NVMLLibraryMismatchError as e:  # not an NVMLError subclass
                last = f"{name}: {e}"
                continue
            except (TypeError, ctypes.ArgumentError) as e:  # a binding that does not fit the library
                last = f"{name}: nvidia-ml-py could not call it: {e}"
                continue
        if not quiet:
            self.errors.append(DetectError(where, last or "no NVML function to call"))
        return None

    # -- what hwprofile reads -----------------------------------------------------------------
    def driver(self) -> Driver:
        version = _text(self.call("driver.version", "nvmlSystemGetDriverVersion"))
        cuda = self.call(
            "driver.cuda_version",
            ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"),
        )
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        return Driver(version=version, cuda_version=cuda_text, nvml_library=self.library)

    def count(self) -> int:
        c = self.call("gpus", "nvmlDeviceGetCount")
        return int(c) if c is not None else 0

    def handle(self, index: int) -> NvmlHandle | None:
        h = self.call(f"gpu[{index}]", "nvmlDeviceGetHandleByIndex", index)
        return NvmlHandle(h) if h is not None else None

    def gpu(self, index: int, handle: NvmlHandle, logical_cpus: int) -> Gpu:
        """Read one GPU. Raises :class:`GpuLost` if the device is lost midway. (The NVML calls go in one
        fixed order, the helpers' included: a GPU lost midway has what was read before it.)"""
        w = f"gpu[{index}]"
        peers = self._nvlink_peers(w, handle)
        self.peers[index] = peers
        pci = self.call(f"{w}.pci", "nvmlDeviceGetPciInfo", handle)
        mem = self._memory_info(w, handle)
        cc = self.call(f"{w}.compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
        numa = self.call(f"{w}.numa_node", "nvmlDeviceGetNumaNodeId", handle, quiet=True)
        aff = self._affinity_masks(w, handle, logical_cpus)
        limit, draw = self._power(w, handle)
        minor = self._minor(w, handle)
        reasons = self.call(
            f"{w}.clocks_event_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            handle,
        )
        name = _text(self.call(f"{w}.name", "nvmlDeviceGetName", handle))
        uuid = _text(self.call(f"{w}.uuid", "nvmlDeviceGetUUID", handle))
        pcie = self._pcie(w, handle)
        temperature, slowdown, shutdown = self._temperatures(w, handle)
        sm_clock, sm_clock_max = self._sm_clocks(w, handle)
        return Gpu(
            index=index,
            name=name,
            uuid=uuid,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            pci_device_id=f"0x{pci.pciDeviceId:08x}" if pci is not None else None,
            minor_number=minor,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            # NVML's memory v1 (drivers < 510) does not say what the driver reserves: not read, not 0
            memory_reserved_bytes=int(mem.reserved) if mem is not None and hasattr(mem, "reserved") else None,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
            numa_node=int(numa) if numa is not None else None,
            numa_node_source="nvml" if numa is not None else None,
            cpu_affinity=(cpulist_from_masks(int(x) for x in aff) or None) if aff is not None else None,
            pcie=pcie,
            nvlink_active_links=len(peers),
            power_limit_watts=limit / 1000 if limit is not None else None,
            power_draw_watts=draw / 1000 if draw is not None else None,
            temperature_c=temperature,
            temperature_slowdown_c=slowdown,
            temperature_shutdown_c=shutdown,
            sm_clock_mhz=sm_clock,
            sm_clock_max_mhz=sm_clock_max,
            clocks_event_reasons=decode_clock_event_reasons(reasons),
            clocks_event_reasons_mask=reasons,
        )

    def _memory_info(self, w: str, handle: NvmlHandle) -> Any:
        """NVML's memory info: v2 where the driver has it (it separates the driver's reservation from what
        processes use; drivers < 510 lack it), else v1; None when neither answers."""
        mem = self.call(f"{w}.memory", "nvmlDeviceGetMemoryInfo", handle, self._n.nvmlMemory_v2, quiet=True)
        if mem is None:
            mem = self.call(f"{w}.memory", "nvmlDeviceGetMemoryInfo", handle)
        return mem

    def _affinity_masks(self, w: str, handle: NvmlHandle, logical_cpus: int) -> Any:
        """The CPUs near the GPU: NVML's 64-bit masks, enough words for ``logical_cpus``; None if not read."""
        words = max(1, (logical_cpus + 63) // 64)
        return self.call(f"{w}.cpu_affinity", "nvmlDeviceGetCpuAffinity", handle, words, quiet=True)

    def _power(self, w: str, handle: NvmlHandle) -> tuple[Any, Any]:
        """``(power limit, power draw)`` in mW as NVML says them: the enforced limit (else the management
        limit); each None where not read."""
        limit = self.call(
            f"{w}.power_limit",
            ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"),
            handle,
        )
        draw = self.call(f"{w}.power_draw", "nvmlDeviceGetPowerUsage", handle)
        return limit, draw

    def _pcie(self, w: str, handle: NvmlHandle) -> PcieLink:
        """The PCIe link: its current generation and width, and the most it can do."""
        return PcieLink(
            gen=self.call(f"{w}.pcie.gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            width=self.call(f"{w}.pcie.width", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            max_gen=self.call(f"{w}.pcie.max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            max_width=self.call(f"{w}.pcie.max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle),
        )

    def _temperatures(self, w: str, handle: NvmlHandle) -> tuple[Any, Any, Any]:
        """``(temperature, slowdown threshold, shutdown threshold)`` in °C, each None where not read."""
        n = self._n
        temperature = self.call(
            f"{w}.temperature", "nvmlDeviceGetTemperature", handle, n.NVML_TEMPERATURE_GPU
        )
        slowdown = self.call(
            f"{w}.temperature_slowdown",
            "nvmlDeviceGetTemperatureThreshold",
            handle,
            n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        )
        shutdown = self.call(
            f"{w}.temperature_shutdown",
            "nvmlDeviceGetTemperatureThreshold",
            handle,
            n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        )
        return temperature, slowdown, shutdown

    def _sm_clocks(self, w: str, handle: NvmlHandle) -> tuple[Any, Any]:
        """``(SM clock, its maximum)`` in MHz, each None where not read."""
        n = self._n
        sm_clock = self.call(f"{w}.sm_clock", "nvmlDeviceGetClockInfo", handle, n.NVML_CLOCK_SM)
        sm_clock_max = self.call(f"{w}.sm_clock_max", "nvmlDeviceGetMaxClockInfo", handle, n.NVML_CLOCK_SM)
        return sm_clock, sm_clock_max

    # -- what the daemon's sampler reads at every tick (host/sampler.py) ------------------------
    def limits(self, index: int, handle: NvmlHandle) -> tuple[int | None, int | None, int | None]:
        """``(slowdown °C, shutdown °C, maximum SM clock MHz)`` of one GPU: read once per GPU, quiet
        (a board without a threshold answers NOT SUPPORTED, which is an answer)."""
        n, w = self._n, f"gpu[{index}]"
        return (
            self.call(
                f"{w}.temperature_slowdown",
                "nvmlDeviceGetTemperatureThreshold",
                handle,
                n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                quiet=True,
            ),
            self.call(
                f"{w}.temperature_shutdown",
                "nvmlDeviceGetTemperatureThreshold",
                handle,
                n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                quiet=True,
            ),
            self.call(f"{w}.sm_clock_max", "nvmlDeviceGetMaxClockInfo", handle, n.NVML_CLOCK_SM, quiet=True),
        )

    def _reading(
        self,
        why: dict[str, str],
        name: str,
        where: str,
        names: str | Sequence[str],
        *args: object,
        quiet: bool = False,
    ) -> Any:
        """One :meth:`call` for the field ``name`` of a reading: None with its reason in ``why``."""
        before = len(self.errors)
        v = self.call(where, names, *args, quiet=quiet)
        if v is None:
            why[name] = self.errors[-1].message if len(self.errors) > before else NOT_SUPPORTED
        return v

    def live(self, index: int, handle: NvmlHandle, margin: bool = True) -> LiveReadings:
        """What changes every tick: temperature (and NVML's margin to the slowdown threshold when
        ``margin``: None where the driver has none), the clock-event reason mask, SM clock, power
        draw and limit (mW), memory used. Failures are recorded in ``errors`` and, per value, in
        the reading's ``why``; raises :class:`GpuLost` for a lost device."""
        n, w = self._n, f"gpu[{index}]"
        why: dict[str, str] = {}
        read = functools.partial(self._reading, why)
        mem = read("memory_used", f"{w}.memory", "nvmlDeviceGetMemoryInfo", handle)
        temperature = read(
            "temperature", f"{w}.temperature", "nvmlDeviceGetTemperature", handle, n.NVML_TEMPERATURE_GPU
        )
        if margin:
            m = read(
                "margin", f"{w}.temperature_margin", "nvmlDeviceGetMarginTemperature", handle, quiet=True
            )
        else:
            m, why["margin"] = None, "not asked: this GPU's driver has no temperature margin"
        reasons = read(
            "reasons",
            f"{w}.clocks_event_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            handle,
        )
        sm_clock = read("sm_clock", f"{w}.sm_clock", "nvmlDeviceGetClockInfo", handle, n.NVML_CLOCK_SM)
        draw = read("power_draw", f"{w}.power_draw", "nvmlDeviceGetPowerUsage", handle)
        limit = read(
            "power_limit",
            f"{w}.power_limit",
            ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"),
            handle,
        )
        return LiveReadings(
            temperature=_int(temperature),
            margin=_int(m),
            reasons=_int(reasons),
            sm_clock=_int(sm_clock),
            power_draw=_int(draw),
            power_limit=_int(limit),
            memory_used=int(mem.used) if mem is not None else None,
            why=why,
        )

    def faults(self, index: int, handle: NvmlHandle) -> FaultCounters:
        """The hardware-fault counters of one GPU, quiet (a board without ECC answers NOT SUPPORTED,
        which is an answer: None): the volatile uncorrectable and correctable ECC counts (since the
        last driver load), retired pages pending a reset (before Ampere), and remapped rows (Ampere
        and later: uncorrectable rows, a remap pending a reset, a remap that failed). Raises
        :class:`GpuLost` for a lost device."""
        n, w = self._n, f"gpu[{index}]"
        why: dict[str, str] = {}
        read = functools.partial(self._reading, why)
        unc = read(
            "ecc_uncorrected",
            f"{w}.ecc_uncorrected",
            "nvmlDeviceGetTotalEccErrors",
            handle,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
            quiet=True,
        )
        corr = read(
            "ecc_corrected",
            f"{w}.ecc_corrected",
            "nvmlDeviceGetTotalEccErrors",
            handle,
            n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            n.NVML_VOLATILE_ECC,
            quiet=True,
        )
        retired = read(
            "retired_pending",
            f"{w}.retired_pages_pending",
            "nvmlDeviceGetRetiredPagesPendingStatus",
            handle,
            quiet=True,
        )
        rows = read("remap_pending", f"{w}.remapped_rows", "nvmlDeviceGetRemappedRows", handle, quiet=True)
        if rows is None:
            why["remap_uncorrectable"] = why["remap_failure"] = why["remap_pending"]
        return FaultCounters(
            ecc_uncorrected=_int(unc),
            ecc_corrected=_int(corr),
            retired_pending=bool(retired) if retired is not None else None,
            remap_uncorrectable=int(rows[1]) if rows is not None else None,
            remap_pending=bool(rows[2]) if rows is not None else None,
            remap_failure=bool(rows[3]) if rows is not None else None,
            why=why,
        )

    def power_limits(self, index: int, handle: NvmlHandle) -> tuple[int | None, int | None, int | None]:
        """``(limit, minimum, maximum)`` of one GPU's power management limit, mW (None: not read,
        recorded in ``errors``; a board without constraints answers NOT SUPPORTED)."""
        w = f"gpu[{index}]"
        limit = self.call(f"{w}.power_limit", "nvmlDeviceGetPowerManagementLimit", handle)
        lo_hi = self.call(
            f"{w}.power_limit_constraints", "nvmlDeviceGetPowerManagementLimitConstraints", handle
        )
        lo, hi = (int(lo_hi[0]), int(lo_hi[1])) if lo_hi is not None else (None, None)
        return (int(limit) if limit is not None else None), lo, hi

    def set_power_limit(self, index: int, handle: NvmlHandle, milliwatts: int) -> str | None:
        """Set one GPU's power management limit (root only); the error, or None once it is set."""
        before = len(self.errors)
        self.call(
            f"gpu[{index}].set_power_limit", "nvmlDeviceSetPowerManagementLimit", handle, int(milliwatts)
        )
        if len(self.errors) > before:
            return self.errors[-1].message
        return None

    def xid_events(self, handles: Mapping[int, NvmlHandle]) -> NvmlEventSet | None:
        """An event set registered for XID critical errors on each of ``handles`` that supports them,
        or None (the driver has no events for these boards: recorded in ``errors``)."""
        n = self._n
        es = self.call("events", "nvmlEventSetCreate")
        if es is None:
            return None
        registered = 0
        for i, h in handles.items():
            kinds = self.call(f"gpu[{i}].events", "nvmlDeviceGetSupportedEventTypes", h, quiet=True)
            if kinds is None or not int(kinds) & n.nvmlEventTypeXidCriticalError:
                continue
            before = len(self.errors)  # the call answers None on success and on failure alike
            self.call(f"gpu[{i}].events", "nvmlDeviceRegisterEvents", h, n.nvmlEventTypeXidCriticalError, es)
            registered += len(self.errors) == before
        if not registered:
            self.call("events", "nvmlEventSetFree", es, quiet=True)
            return None
        return NvmlEventSet(es)

    def poll_xids(
        self, events: NvmlEventSet, handles: Mapping[int, NvmlHandle], limit: int = 64
    ) -> list[tuple[int, int]]:
        """Every XID event waiting in ``events`` now (no wait): ``(GPU index, XID)`` pairs."""
        n, out = self._n, []
        for _ in range(limit):
            try:
                with _CALL_LOCK:
                    data = n.nvmlEventSetWait_v2(events, 0)
            except n.NVMLError_Timeout:
                break
            except n.NVMLError as e:
                self.errors.append(DetectError("events", f"nvmlEventSetWait_v2: {_err_text(n, e)}"))
                break
            if not data.eventType & n.nvmlEventTypeXidCriticalError:
                continue
            where = ctypes.cast(data.device, ctypes.c_void_p).value
            index = next((i for i, h in handles.items() if _address(h) == where), -1)
            out.append((index, int(data.eventData)))
        return out

    def free_events(self, events: NvmlEventSet) -> None:
        self.call("events", "nvmlEventSetFree", events, quiet=True)

    def memory(self, index: int, handle: NvmlHandle) -> tuple[int, int] | None:
        """``(total, free)`` bytes of one GPU as CUDA counts them (v2 where the driver has it, as
        :meth:`gpu` reads it: the total less the driver's reservation, which its free excludes too; v1
        does not say the reservation, and its total is NVML's), or None when it cannot be read
        (recorded in ``errors``). Raises :class:`GpuLost` for a lost device."""
        w = f"gpu[{index}].memory"
        mem = self.call(w, "nvmlDeviceGetMemoryInfo", handle, self._n.nvmlMemory_v2, quiet=True)
        if mem is None:
            mem = self.call(w, "nvmlDeviceGetMemoryInfo", handle)
        if mem is None:
            return None
        return int(mem.total) - int(getattr(mem, "reserved", 0)), int(mem.free)

    def _minor(self, where: str, handle: NvmlHandle) -> int | None:
        """The device minor number: N of ``/dev/nvidiaN`` (``nvidia-smi``'s "Minor Number"), which
        need not equal the NVML index. NOT_SUPPORTED, a driver without the call or a value outside
        :data:`MAX_DEVICE_MINOR` is ``None`` (recorded in ``errors``): never the index in its place."""
        w = f"{where}.minor_number"
        minor = self.call(w, "nvmlDeviceGetMinorNumber", handle)
        if minor is None:
            return None
        if type(minor) is not int or not 0 <= minor <= MAX_DEVICE_MINOR:
            self.errors.append(
                DetectError(
                    w, f"nvmlDeviceGetMinorNumber: {minor!r} is not a device minor (0-{MAX_DEVICE_MINOR})"
                )
            )
            return None
        return minor

    def _nvlink_peers(self, where: str, handle: NvmlHandle) -> list[str | None]:
        """One entry per active NVLink link: the PCI bus id at its far end, :data:`NVSWITCH` when
        the link ends at an NVSwitch (then every GPU on the fabric is reachable), ``None`` if unreadable.

        A board without NVLink answers NOT_SUPPORTED on link 0, which ends the scan: no links.
        """
        peers: list[str | None] = []
        for link in range(MAX_NVLINKS):
            w = f"{where}.nvlink[{link}]"
            state = self.call(w, "nvmlDeviceGetNvLinkState", handle, link, quiet=True)
            if state is None:
                break
            if not state:
                continue
            kind = self.call(f"{w}.type", "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, quiet=True)
            if kind == self._n.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                peers.append(NVSWITCH)
                continue
            remote = self.call(f"{w}.remote", "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            peers.append(_text(remote.busId) if remote is not None else None)
        return peers

    def links(self, gpus: Sequence[Gpu], handles: Mapping[int, NvmlHandle]) -> tuple[GpuLink, ...]:
        """Link kind and P2P support between each pair of usable GPUs."""
        n = self._n
        out: list[GpuLink] = []
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                where = f"link[{a.index},{b.index}]"
                nv = _nvlink_count(self.peers.get(a.index, []), self.peers.get(b.index, []), b.pci_bus_id)
                try:
                    if nv:
                        kind: str | None = f"NV{nv}"
                    else:
                        level = self.call(
                            where, "nvmlDeviceGetTopologyCommonAncestor", handles[a.index], handles[b.index]
                        )
                        kind = TOPOLOGY_LEVELS.get(level) if level is not None else None
                    status = {
                        cap: self.call(
                            f"{where}.p2p_{cap}",
                            "nvmlDeviceGetP2PStatus",
                            handles[a.index],
                            handles[b.index],
                            index,
                        )
                        for cap, index in (
                            ("read", P2P_CAPS_INDEX_READ),
                            ("write", P2P_CAPS_INDEX_WRITE),
                            ("atomics", P2P_CAPS_INDEX_ATOMICS),
                        )
                    }
                except GpuLost:
                    continue
                ok = {k: None if v is None else v == n.NVML_P2P_STATUS_OK for k, v in status.items()}
                out.append(
                    GpuLink(
                        a=a.index,
                        b=b.index,
                        link=kind,
                        p2p=ok["read"],
                        p2p_write=ok["write"],
                        p2p_atomics=ok["atomics"],
                    )
                )
        return tuple(out)


def _nvlink_count(peers_a: list[str | None], peers_b: list[str | None], bus_b: str | None) -> int:
    """NVLink links between a and b: direct links from a to b's bus id, or, when both sit on an
    NVSwitch fabric, the smaller of their switch link counts (what ``nvidia-smi topo`` shows)."""
    direct = sum(1 for p in peers_a if p and p != NVSWITCH and bus_b and _same_bus(p, bus_b))
    switched = min(peers_a.count(NVSWITCH), peers_b.count(NVSWITCH))
    return direct + switched


def _same_bus(x: str, y: str) -> bool:
    def norm(s: str) -> str:
        dom, _, rest = s.lower().partition(":")
        return f"{int(dom, 16):x}:{rest}" if dom else rest

    try:
        return norm(x) == norm(y)
    except ValueError:
        return x.lower() == y.lower()


def _address(handle: NvmlHandle) -> int | None:
    """The address a pynvml handle (a ctypes pointer) points at."""
    return ctypes.cast(typing.cast("ctypes.c_void_p", handle), ctypes.c_void_p).value


def _int(v: SupportsInt | None) -> int | None:
    return int(v) if v is not None else None


def _text(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return str(v).rstrip("\x00") or None


def _err_text(n: ModuleType, e: Exception) -> str:
    value = getattr(e, "value", None)
    try:
        text = str(e)
    except Exception:  # pynvml's __str__ calls back into the library
        text = "error"
    return f"{text} (NVML error {value})" if value is not None else text


def _describe_init_error(n: ModuleType, e: Exception) -> str:
    if isinstance(e, n.NVMLError_LibraryNotFound):
        return (
            "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver is installed here "
            "(or set HWPROFILE_NVML_LIBRARY to its path)"
        )
    if isinstance(e, n.NVMLError_DriverNotLoaded):
        return "NVIDIA driver is not loaded (is the kernel module loaded? try `nvidia-smi`)"
    if isinstance(e, n.NVMLError_LibRmVersionMismatch):
        return "NVML library and kernel driver versions differ: reboot or reload the nvidia module"
    if isinstance(e, n.NVMLError_NoPermission):
        return "no permission to open the NVIDIA devices (/dev/nvidia*)"
    return f"NVML initialisation failed: {_err_text(n, e)}"


_PROBE = (
    "import ctypes,sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "init = getattr(lib, 'nvmlInitWithFlags', None)\n"
    "r = init(0) if init else lib.nvmlInit_v2()\n"
    "r == 0 and lib.nvmlShutdown()\n"
)
_probed: dict[tuple[str, int, int], str | None] = {}


def probe_library(lib: str) -> str | None:
    """Why ``lib`` cannot be used (it crashed, or hung, in ``nvmlInit`` in a child process), or
    None. Asked once per file (path, size, time) in a process."""
    import signal
    import subprocess
    import sys

    try:
        st = os.stat(lib)
    except OSError as e:
        return f"HWPROFILE_NVML_LIBRARY={lib} cannot be loaded: {e.strerror}"
    key = (os.path.realpath(lib), st.st_size, st.st_mtime_ns)
    if key not in _probed:
        try:
            r = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _PROBE, lib],
                capture_output=True,
                timeout=30,
                env={**os.environ, "PYTHONFAULTHANDLER": ""},
            )
            died = -r.returncode if r.returncode < 0 else None
            _probed[key] = (
                f"HWPROFILE_NVML_LIBRARY={lib} crashed in nvmlInit ({signal.Signals(died).name}, in a test "
                "process): not used; is it an NVML library of this architecture and driver?"
                if died
                else None
            )
        except subprocess.TimeoutExpired:
            _probed[key] = (
                f"HWPROFILE_NVML_LIBRARY={lib}: nvmlInit did not return within 30 s (in a test process): not used"
            )
    return _probed[key]


def _loaded_path(n: ModuleType) -> str | None:
    lib = getattr(n, "nvmlLib", None)
    name = getattr(lib, "_name", None)
    if not name:
        return None
    # Resolve the soname to the file actually mapped into this process.
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                if "libnvidia-ml.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return str(name)
