"""A child's output into a size-capped, rotating log on tmpfs (RAM: capped, oldest dropped first)."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import IO

from ..runtime.dirs import private_dir

__all__ = ["RotatingLog", "private_dir", "pump"]

_LEVEL = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")
_STDOUT = threading.Lock()  # one writer of fd 1 at a time: the lines of two instances never mix


class RotatingLog:
    """Writes lines to ``dir/vllm.log``; past ``max_bytes / files`` bytes the file becomes
    ``vllm.log.1`` (older ones shift up, the oldest beyond ``files`` is deleted). Files are 0600.
    Keeps the last lines in memory for progress messages and failure reports.

    Writing never raises and never waits on a full disk: a line that cannot be written (a full tmpfs,
    a removed directory) is dropped and counted (``dropped``, ``last_error``), so the child's pipe
    keeps being drained; the in-memory tail still gets it."""

    def __init__(
        self, directory: Path, max_bytes: int, files: int = 4, name: str = "vllm.log", echo: str | None = None
    ) -> None:
        self.dir = private_dir(directory)
        self.echo = echo  # logs.stdout: each line also to fd 1 with this prefix (a container's log)
        self.path = self.dir / name
        self.files = max(2, files)
        self.limit = max(4096, max_bytes // self.files)
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.lock = threading.Lock()
        self.dropped = 0
        self.last_error: str | None = None
        self.count = 0  # lines written so far: a start notes it, and reads only its own lines back
        self._fd: int | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        self._fd, self._size = fd, os.fstat(fd).st_size

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rotate(self) -> None:
        self._close_fd()
        oldest = self.dir / f"{self.path.name}.{self.files - 1}"
        if oldest.exists():
            oldest.unlink()
        for i in range(self.files - 2, 0, -1):
            src = self.dir / f"{self.path.name}.{i}"
            if src.exists():
                src.replace(self.dir / f"{self.path.name}.{i + 1}")
        self.path.replace(self.dir / f"{self.path.name}.1")
        self._open()

    def _emit(self, data: bytes) -> None:
        """One write of the whole line (unbuffered: nothing half-written is kept for later)."""
        if self._fd is None:
            self._open()
        if self._size + len(data) > self.limit:
            self._rotate()
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n

    def write(self, line: str) -> None:
        with self.lock:
            self.tail.append(line.rstrip("\n"))
            self.count += 1
            data = line.encode("utf-8", "replace")
            if self.echo is not None:
                self._echo(data)
            try:
                self._emit(data)
            except OSError as e:
                self.dropped += 1
                self.last_error = f"{e.strerror or e} ({self.path})"
                with contextlib.suppress(OSError):
                    self._close_fd()  # reopened on the next line: the disk may have room again

    def _echo(self, data: bytes) -> None:
        """The line to stdout, whole (under :data:`_STDOUT`: lines of two instances never mix); a
        closed stdout drops it, as a full disk does for the file."""
        assert self.echo is not None
        out = self.echo.encode() + (data if data.endswith(b"\n") else data + b"\n")
        try:
            view = memoryview(out)
            with _STDOUT:
                while view:
                    view = view[os.write(1, view) :]
        except OSError as e:
            self.dropped += 1
            self.last_error = f"stdout: {e.strerror or e}"

    def mark(self, text: str) -> None:
        self.write(f"--- hwprofile: {text}\n")

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.tail)

    def text_since(self, count: int) -> str:
        """The lines of the tail written after the first ``count`` (a start's own lines, not the
        earlier starts' that the tail still holds)."""
        with self.lock:
            n = self.count - count
            return "\n".join(list(self.tail)[-n:]) if n > 0 else ""

    def last_line(self) -> str:
        with self.lock:
            return next(
                (ln for ln in reversed(self.tail) if ln.strip() and not ln.startswith("--- hwprofile")), ""
            )

    def close(self) -> None:
        with self.lock, contextlib.suppress(OSError):
            self._close_fd()


def pump(stream: IO[bytes], sink: RotatingLog, logger: logging.Logger, instance: str) -> threading.Thread:
    """Copy ``stream`` into ``sink`` line by line on a thread; WARNING/ERROR lines also go to hwprofile's
    log (the ``hwprofile.vllm`` logger: the log file, not the terminal). It keeps reading whatever
    happens to the sink, so the child never blocks on a full pipe; the stream is read to its end."""
    forwarded = logger.getChild("vllm")

    def run() -> None:
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace")
                sink.write(line)
                m = _LEVEL.search(line)
                if m:
                    with contextlib.suppress(Exception):  # a broken log handler must not stop the pump
                        forwarded.log(getattr(logging, m.group(1)), "%s: %s", instance, line.rstrip())
        finally:
            with contextlib.suppress(OSError):
                stream.close()

    t = threading.Thread(target=run, name=f"log-{instance}", daemon=True)
    t.start()
    return t
