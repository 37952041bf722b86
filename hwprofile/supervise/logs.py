"""A child's output into a size-capped, rotating log on tmpfs (RAM: capped, oldest dropped first)."""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
from pathlib import Path
from typing import IO

_LEVEL = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b")


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700 for the last component; fix the mode if it exists."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class RotatingLog:
    """Writes lines to ``dir/vllm.log``; past ``max_bytes / files`` bytes the file becomes
    ``vllm.log.1`` (older ones shift up, the oldest beyond ``files`` is deleted). Files are 0600.
    Keeps the last lines in memory for progress messages and failure reports."""

    def __init__(self, directory: Path, max_bytes: int, files: int = 4, name: str = "vllm.log") -> None:
        self.dir = private_dir(directory)
        self.path = self.dir / name
        self.files = max(2, files)
        self.limit = max(4096, max_bytes // self.files)
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.lock = threading.Lock()
        self._f: IO[str] | None = None
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        self._f = os.fdopen(fd, "a", encoding="utf-8", errors="replace")

    def _rotate(self) -> None:
        assert self._f is not None
        self._f.close()
        oldest = self.dir / f"{self.path.name}.{self.files - 1}"
        if oldest.exists():
            oldest.unlink()
        for i in range(self.files - 2, 0, -1):
            src = self.dir / f"{self.path.name}.{i}"
            if src.exists():
                src.replace(self.dir / f"{self.path.name}.{i + 1}")
        self.path.replace(self.dir / f"{self.path.name}.1")
        self._open()

    def write(self, line: str) -> None:
        with self.lock:
            assert self._f is not None
            if self._f.tell() + len(line) > self.limit:
                self._rotate()
            self._f.write(line)
            self._f.flush()
            self.tail.append(line.rstrip("\n"))

    def mark(self, text: str) -> None:
        self.write(f"--- hwprofile: {text}\n")

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.tail)

    def last_line(self) -> str:
        with self.lock:
            return next(
                (ln for ln in reversed(self.tail) if ln.strip() and not ln.startswith("--- hwprofile")), ""
            )

    def close(self) -> None:
        with self.lock:
            if self._f:
                self._f.close()
                self._f = None


def pump(stream: IO[bytes], sink: RotatingLog, logger: logging.Logger, instance: str) -> threading.Thread:
    """Copy ``stream`` into ``sink`` line by line on a thread; WARNING/ERROR lines also go to hwprofile's
    log (the ``hwprofile.vllm`` logger: the log file, not the terminal)."""
    forwarded = logger.getChild("vllm")

    def run() -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            sink.write(line)
            m = _LEVEL.search(line)
            if m:
                forwarded.log(getattr(logging, m.group(1)), "%s: %s", instance, line.rstrip())
        stream.close()

    t = threading.Thread(target=run, name=f"log-{instance}", daemon=True)
    t.start()
    return t
