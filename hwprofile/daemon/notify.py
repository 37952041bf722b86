"""sd_notify for ``hwprofile daemon`` under systemd (``Type=notify``): READY=1, STATUS=, RELOADING=1,
STOPPING=1 and WATCHDOG=1, all sent from the loop thread.

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` is the abstract namespace), which sd_notify(3) documents as a
stable interface; it is spoken here, with the standard library, so the unit works without a
compiled extra (systemd-python has no wheels: it needs a compiler, ``libsystemd-dev`` and
``pkg-config``). Tested against a socket the test creates and against a real ``systemd --user``
manager. Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op. A failed notification is
logged once per kind of failure, never raised.

vLLM must not inherit ``NOTIFY_SOCKET`` or ``WATCHDOG_*`` (it would then speak for the unit):
:meth:`Notifier.from_environ` removes them from ``os.environ`` — the mapping the supervisor copies
into every child's environment.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .loop import Daemon

log = logging.getLogger("hwprofile")
ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def send_datagram(address: str, message: str) -> None:
    """One sd_notify datagram to ``address`` (``@name`` = abstract socket). Raises OSError."""
    if not address or address[0] not in "/@":
        raise OSError(f"NOTIFY_SOCKET={address!r}: not an AF_UNIX socket path")
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.sendto(message.encode(), target)


class Notifier:
    """What the daemon tells systemd; ``clock`` is the loop's monotonic clock, for the watchdog's
    pacing."""

    def __init__(
        self,
        socket_path: str | None,
        watchdog_usec: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path or None
        self.watchdog_usec = watchdog_usec if socket_path else None
        self.clock = clock
        self.last_ping: float | None = None
        self.last_status: str | None = None
        self.failures: set[str] = set()
        self.sent: list[str] = []  # what was sent, for `hwprofile status` and tests (bounded)

    @classmethod
    def from_environ(
        cls,
        environ: MutableMapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Notifier:
        """Read NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID (sd_watchdog_enabled(3): the watchdog
        is ours only when WATCHDOG_PID is unset or our PID), then remove all three from ``environ``
        (default ``os.environ``) so that no child inherits them."""
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET") or None
        usec = _watchdog_usec(env)
        for k in ENV_KEYS:
            env.pop(k, None)
        return cls(path, usec, clock)

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def send(self, **fields: object) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram (keys upper-cased); False when not under systemd
        or when sending failed (logged)."""
        if not self.socket_path:
            return False
        message = "\n".join(f"{k.upper()}={_one_line(v)}" for k, v in fields.items())
        try:
            send_datagram(self.socket_path, message)
        except OSError as e:
            kind = f"{type(e).__name__}:{getattr(e, 'errno', '')}"
            if kind not in self.failures:
                self.failures.add(kind)
                log.error("sd_notify to %s failed: %s (%s)", self.socket_path, e, message.splitlines()[0])
            return False
        self.sent.append(message)
        del self.sent[:-200]
        return True

    # -- the messages the daemon sends ------------------------------------------------------------
    def ready(self, status: str | None = None) -> bool:
        fields: dict[str, object] = {"ready": 1, "mainpid": os.getpid()}
        if status:
            fields["status"] = status
            self.last_status = _one_line(status)
        return self.send(**fields)

    def status(self, text: str) -> bool:
        """STATUS=, sent only when the line changed."""
        line = _one_line(text)
        if line == self.last_status:
            return False
        self.last_status = line
        return self.send(status=line)

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.last_status = "reloading the configuration"
        return self.send(reloading=1, monotonic_usec=usec, status=self.last_status)

    def stopping(self, drain_s: float | None = None) -> bool:
        """STOPPING=1; with ``drain_s`` also EXTEND_TIMEOUT_USEC (systemd 236+): the stop may take
        that long from now, whatever TimeoutStopSec the unit was written with (an override that
        lengthened ``server.shutdown_timeout`` after install-service is covered)."""
        self.last_status = "draining and stopping every instance"
        fields: dict[str, object] = {"stopping": 1, "status": self.last_status}
        if drain_s is not None:
            fields["extend_timeout_usec"] = int(drain_s * 1e6)
        return self.send(**fields)

    def watchdog(self) -> bool:
        """WATCHDOG=1, at most every half of WATCHDOG_USEC (call it after each completed tick)."""
        if not self.watchdog_usec:
            return False
        now = self.clock()
        if self.last_ping is not None and now - self.last_ping < self.watchdog_usec / 2e6:
            return False
        self.last_ping = now
        return self.send(watchdog=1)


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    try:
        usec = int(env.get("WATCHDOG_USEC") or 0)
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0:
        return None
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec


def _one_line(v: object) -> str:
    return " ".join(str(v).split())


def status_line(daemon: Daemon) -> str:
    """The one STATUS= line: ready count, each GPU not ``ok`` and the degrade steps in force, the
    restart in flight, the last reload error, the mean speculative acceptance — e.g.
    ``2/2 ready · GPU2 hot 84 °C, degraded · acceptance 71 %``."""
    insts = list(daemon.sup.instances)
    ready = sum(1 for i in insts if i.state.value == "ready")
    degraded = sorted(n for n, level in daemon.levels.items() if level)
    # "2/2 ready" alone while one of them runs at a degrade step would say the profile is in full force
    parts = [
        f"{ready}/{len(insts)} ready"
        + (f" ({len(degraded)} degraded: {', '.join(degraded)})" if degraded else "")
    ]
    rep = daemon.report
    degraded_gpus: set[int] = set()
    for name, level in daemon.levels.items():
        if level:
            spec = daemon.watcher.instances.get(name)
            degraded_gpus.update(spec.gpus if spec else ())
    if rep is not None:
        for g in rep.gpus:
            j = g.to_json()
            if j["thermal_state"] != "ok":
                t = j.get("temperature_c")
                text = f"GPU{j['index']} {j['thermal_state']}" + (
                    f" {t:.0f} °C" if isinstance(t, int | float) else ""
                )
                if j["index"] in degraded_gpus:
                    text += ", degraded"
                parts.append(text)
            if j.get("faults"):
                parts.append(f"GPU{j['index']} FAULT " + ", ".join(f.split(":", 1)[0] for f in j["faults"]))
        lowered = getattr(daemon, "power_saved", {}) or {}
        if lowered:
            parts.append("power limit lowered on GPU " + ",".join(map(str, sorted(lowered))))
        drained = [i.name for i in rep.instances if getattr(i, "drained", None)]
        if drained:
            parts.append(f"drained for a hardware fault: {', '.join(drained)}")
        drifting = [i.name for i in rep.instances if getattr(i, "drift", None)]
        if drifting:
            parts.append(f"drifting from baseline: {', '.join(drifting)}")
        acc = [i.acceptance_rate for i in rep.instances if i.acceptance_rate is not None]
        if acc:
            parts.append(f"acceptance {100 * sum(acc) / len(acc):.0f} %")
    from .loop import instance_troubles

    parts.extend(instance_troubles(insts).values())  # failed, or failing /health: what needs a look
    if daemon.current is not None:
        parts.append(f"restarting {daemon.current.action.instance}")
    trouble = getattr(daemon, "runtime_trouble", None)
    if trouble:
        parts.append(trouble)
    err = getattr(daemon, "reload_error", None)
    if err:
        parts.append(f"reload failed, last good plan kept: {err}")
    return " · ".join(parts)
