"""The daemon's reactions as typed actions: what a pure policy decides (``policy``, ``watcher``) and the
loop's dispatcher carries out (:meth:`.loop.Daemon.act`, keyed on the action's type).

Each action is a frozen value: the instance it is for, why, the GPUs it concerns, the degrade step in
force after it (0: the full profile) and ``evidence``, the readings that decided it (a GPU's reading, an
instance's progress, its drift reading). Adding a reaction: a policy that returns a new action class, and
one handler registered for that class in the loop's dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeAlias

if TYPE_CHECKING:
    from ..host.sampler import GpuReading
    from .readings import DriftReading, Progress

    Evidence: TypeAlias = GpuReading | Progress | DriftReading


@dataclass(frozen=True)
class _Action:
    instance: str
    reason: str
    gpus: tuple[int, ...] = ()
    level: int = 0  # the degrade step in force after the action (0 = the full profile)
    evidence: tuple[Evidence, ...] = ()  # the readings that decided it
    kind: ClassVar[str] = ""  # journald's ACTION=, daemon.json's "kind", the exporter's label


@dataclass(frozen=True)
class Degrade(_Action):
    """A thermal step down: restart the instance at degrade step ``level`` (hot: 1, critical: 2)."""

    kind: ClassVar[str] = "degrade"


@dataclass(frozen=True)
class Recover(_Action):
    """Cool long enough: the full profile again (a restart), or only the power limit restored (``level``
    0 while the instance never left the full profile)."""

    kind: ClassVar[str] = "recover"


@dataclass(frozen=True)
class PowerCap(_Action):
    """The first thermal step where the card allows it: its power limit lowered, no restart."""

    kind: ClassVar[str] = "power"


@dataclass(frozen=True)
class Restart(_Action):
    """Liveness: work pending and no progress: drain, then the same settings (the step in force)."""

    kind: ClassVar[str] = "restart"


@dataclass(frozen=True)
class Recycle(_Action):
    """Drift: slow decay held for long, off-peak now: a planned drain and restart at the same settings."""

    kind: ClassVar[str] = "recycle"


@dataclass(frozen=True)
class Drain(_Action):
    """A fatal hardware fault on the instance's GPU(s): stop it, never restart it there."""

    kind: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Reload(_Action):
    """The configuration changed: restart the instance with its new settings (the loop's own, from a reload)."""

    kind: ClassVar[str] = "reload"


Action: TypeAlias = Degrade | Recover | PowerCap | Restart | Recycle | Drain | Reload
# the actions that restart the instance (queued, one restart in flight at a time)
RESTARTS = (Degrade, Recover, Restart, Recycle, Reload)
