"""The planning context: what every planning step reads (the host, the settings, the release it plans
for) and what it writes (each value's reason, the plan's warnings), in one object passed down
instead of a ``Reasons`` collector and a ``warnings`` list as out-parameters beside the inputs."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from ..config.settings import Settings
from ..host.snapshot import HostSnapshot
from ..record import record
from ..release import Release, release_of
from .reasons import Reasons

T = TypeVar("T")


@record
class PlanContext:
    """One plan's inputs and its two outputs besides the instances.

    ``reasons`` and ``warnings`` are shared by every context derived with :meth:`on` (a node of a plan
    over several hosts, the settings a layout try uses): what a step records lands in the one plan.
    """

    host: HostSnapshot
    settings: Settings
    reasons: Reasons
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def version(self) -> str | None:
        """The vLLM release the plan is for, as the snapshot says it (None: unknown)."""
        return self.host.software.vllm_version

    @property
    def release(self) -> Release:
        """That release's facts (:mod:`hwprofile.release`)."""
        return release_of(self.version)

    def add(self, key: str, value: T, reason: str, setting: tuple[str, ...] | None = None) -> T:
        """Record ``value`` for ``key`` with its reason (:meth:`.Reasons.add`); returns ``value``."""
        self.reasons.add(key, value, reason, setting)
        return value

    def warn(self, text: str) -> None:
        """Add a warning to the plan."""
        self.warnings.append(text)

    def on(self, host: HostSnapshot | None = None, settings: Settings | None = None) -> PlanContext:
        """This context for another host or other settings, recording into the same reasons and
        warnings."""
        return dataclasses.replace(
            self,
            host=self.host if host is None else host,
            settings=self.settings if settings is None else settings,
        )


__all__ = ["PlanContext"]
