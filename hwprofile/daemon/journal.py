"""Logging to the systemd journal with fields: when the daemon's stderr is the journal (systemd sets
``JOURNAL_STREAM`` to stderr's ``device:inode``), the stderr handler is swapped for one that sends each
record over journald's native protocol, so ``journalctl -u hwprofile PRIORITY=3`` or ``INSTANCE=…``
work. Fields: MESSAGE, PRIORITY (syslog level), SYSLOG_IDENTIFIER=hwprofile, LOGGER, CODE_FILE,
CODE_LINE, CODE_FUNC, and every UPPERCASE attribute a record carries (``extra={"INSTANCE": name}``).

One datagram per record to ``/run/systemd/journal/socket``, in journald's native protocol
(documented as stable: systemd.io/JOURNAL_NATIVE_PROTOCOL; values with a newline in its binary
form), spoken here with the standard library as sd_notify is (:mod:`.notify`). A failed send falls
back to stderr for that record, never raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import sys
from collections.abc import Mapping

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "hwprofile"
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def encode(fields: Mapping[str, object]) -> bytes:
    """journald's native datagram: ``KEY=value\\n``, or ``KEY\\n<le64 length><value>\\n`` when the
    value has a newline."""
    out = bytearray()
    for k, v in fields.items():
        data = v if isinstance(v, bytes) else str(v).encode()
        key = k.upper().encode()
        if b"\n" in data:
            out += key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key + b"=" + data + b"\n"
    return bytes(out)


def stderr_is_journal(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    stream = env.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class JournalHandler(logging.Handler):
    def __init__(self, address: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.address = address
        self.sock: socket.socket | None = None

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        f: dict[str, object] = {
            "MESSAGE": self.format(record),
            "PRIORITY": PRIORITY.get(record.levelno, 6),
            "SYSLOG_IDENTIFIER": IDENTIFIER,
            "LOGGER": record.name,
            "CODE_FILE": record.pathname,
            "CODE_LINE": record.lineno,
            "CODE_FUNC": record.funcName,
        }
        for k, v in vars(record).items():
            if k.isupper() and k.replace("_", "").isalnum() and v is not None:
                f[k] = v
        return f

    def emit(self, record: logging.LogRecord) -> None:
        try:
            f = self.fields(record)
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self.sock.sendto(encode(f), self.address)
        except Exception:
            with contextlib.suppress(Exception):  # nothing left to say it to
                # stderr is the journal's stream: "<N>" sets the line's priority (sd-daemon(3))
                sys.stderr.write(f"<{PRIORITY.get(record.levelno, 6)}>{self.format(record)}\n")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        super().close()


def attach(logger: logging.Logger | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Under systemd with stderr on the journal: replace ``logger``'s stderr handlers (default the
    ``hwprofile`` logger) by a :class:`JournalHandler` with the same level and format. Returns
    whether it did."""
    if not stderr_is_journal(environ):
        return False
    logger = logger or logging.getLogger("hwprofile")
    handler = JournalHandler()
    olds = [
        h
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr
    ]
    if olds:
        handler.setLevel(olds[0].level)
        handler.setFormatter(logging.Formatter("%(message)s"))  # the journal has time and level
        for flt in olds[0].filters:
            handler.addFilter(flt)
    for h in olds:
        logger.removeHandler(h)
    logger.addHandler(handler)
    return True
