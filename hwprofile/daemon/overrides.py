"""Live configuration: watch the config root (``profiles/``, ``overrides.d/``, ``rules.d/``) with the
``watchdog`` package and turn each burst of edits into one reload of the daemon.

The observer's handler only matches paths and stamps "something changed" under a lock: it never
re-plans (that is the loop's job, on the loop's clock). Editors save through a temp file renamed
over the target, which arrives as a move whose ``dest_path`` is the YAML file, so both ``src_path``
and ``dest_path`` are matched; created, modified, closed, moved and deleted all count (a deleted
override is a change). :meth:`ConfigWatch.poll`, called by the loop each tick, debounces: the
reload is due once no event came for ``quiet_s`` seconds of the loop's clock. The root is watched
recursively, so a sub-directory removed and created again is picked up by the observer; a root
that disappears and comes back (or appears late) is scheduled again by ``poll``. :meth:`close`
stops and joins the observer."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.events import FileSystemEventHandler

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import ObservedWatch

log = logging.getLogger("hwprofile")
WATCHED = ("profiles", "overrides.d", "rules.d")
SUFFIXES = (".yaml", ".yml")
CHANGES = {"created", "modified", "moved", "deleted", "closed"}


def relevant(root: Path, path: str | bytes | None) -> bool:
    """A YAML file (or one of the watched directories themselves) under ``root``."""
    if not path:
        return False
    p = Path(os.fsdecode(path))
    try:
        rel = p.relative_to(root)
    except ValueError:
        return False
    parts = rel.parts
    if not parts or parts[0] not in WATCHED:
        return False
    return len(parts) == 1 or (p.suffix in SUFFIXES and not p.name.startswith("."))


class ConfigWatch:
    """One watchdog observer on ``root``; ``poll(now)`` returns the reason of a due reload."""

    def __init__(self, root: Path, quiet_s: float = 0.5, clock: Callable[[], float] | None = None) -> None:
        from watchdog.observers import Observer

        self.root = Path(root)
        self.quiet_s = quiet_s
        self._lock = threading.Lock()
        self._events: list[str] = []  # paths seen since the last poll (bounded)
        self._last_event: float | None = None  # loop clock of the last poll that found events
        self._paths: list[str] = []
        self._watch: ObservedWatch | None = None
        self._root_id: tuple[int, int] | None = None
        self.observer = Observer()
        self.observer.daemon = True
        self._schedule()
        self.observer.start()

    # -- observer side (the dispatch thread): match, stamp, never raise --------------------------
    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            kind = getattr(event, "event_type", "")
            if kind not in CHANGES:  # opened, closed_no_write: our own re-plan reading the files
                return
            paths = [p for p in (getattr(event, "src_path", None), getattr(event, "dest_path", None)) if p]
            hit = [os.fsdecode(p) for p in paths if relevant(self.root, p)]
            if kind == "modified" and getattr(event, "is_directory", False):
                hit = []  # a directory's own mtime: the file events say what changed
            if getattr(event, "event_type", "") == "deleted" and os.fsdecode(event.src_path) == str(
                self.root
            ):
                hit.append(str(self.root))
            if hit:
                with self._lock:
                    self._events.extend(f"{event.event_type} {h}" for h in hit[:2])
                    del self._events[:-50]
        except Exception:  # an exception here would end the dispatch thread: watching would stop
            pass

    # -- loop side ---------------------------------------------------------------------------------
    def _schedule(self) -> bool:
        try:
            st = self.root.stat()
        except OSError:
            self._watch, self._root_id = None, None
            return False
        try:
            self._watch = self.observer.schedule(_Handler(self), str(self.root), recursive=True)
        except OSError as e:
            log.error("cannot watch %s: %s (edits are applied on `hwprofile reload` only)", self.root, e)
            self._watch = None
            return False
        self._root_id = (st.st_dev, st.st_ino)
        return True

    def _check_root(self) -> str | None:
        """Re-schedule when the root came back (a new inode) or appeared; returns a reason."""
        try:
            st = self.root.stat()
            now_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            now_id = None
        if now_id == self._root_id:
            return None
        if self._watch is not None:
            with contextlib.suppress(KeyError, OSError):
                self.observer.unschedule(self._watch)
            self._watch = None
        if now_id is None:
            self._root_id = None
            return f"{self.root} is gone"
        return f"{self.root} is back" if self._schedule() else None

    def pending(self) -> int:
        """Events delivered since the last :meth:`poll` (what a test waits on before it polls)."""
        with self._lock:
            return len(self._events)

    def poll(self, now: float) -> str | None:
        """Called by the loop each tick: the reason once events stopped for ``quiet_s``."""
        came = self._check_root()
        with self._lock:
            events, self._events = self._events, []
        if came:
            events.append(came)
        if events:
            self._last_event = now
            self._paths = (self._paths + events)[-5:]
            return None
        if self._last_event is not None and now - self._last_event >= self.quiet_s:
            self._last_event = None
            paths, self._paths = self._paths, []
            return "configuration files changed: " + ", ".join(dict.fromkeys(paths))
        return None

    def close(self) -> None:
        self.observer.stop()
        self.observer.join(10)


class _Handler(FileSystemEventHandler):
    """The watchdog handler: everything goes to :meth:`ConfigWatch.dispatch`."""

    def __init__(self, watch: ConfigWatch) -> None:
        super().__init__()
        self.watch = watch

    def dispatch(self, event: FileSystemEvent) -> None:
        self.watch.dispatch(event)
