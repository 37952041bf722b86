"""What a plan is made from (:class:`PlanInputs`: a re-plan starts from the same inputs), and the
launch file a detached supervisor starts from (``<runtime>/launch.json``: the plan, its inputs, the
vLLM release)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..plan.types import Plan
from ..runtime.dirs import private_dir
from .prepare import LaunchError, log

if TYPE_CHECKING:
    from ..host.snapshot import HostSnapshot

LAUNCH_FILE = "launch.json"
LAUNCH_SCHEMA = "hwprofile.launch/1"


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is made from: a re-plan (the memory ladder's) starts from the same inputs with
    more ``--set`` overrides. The environment's ``HWPROFILE_*`` layer is read again at each re-plan."""

    host: HostSnapshot
    config_root: str
    profile: str | None = None
    overrides: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    model: str | None = None
    draft: str | None = None

    def replan(self, extra: Sequence[str] = ()) -> Plan:
        """The plan of these inputs, with ``extra`` ``--set`` overrides after their own."""
        from ..pipeline import make_plan

        return make_plan(
            self.host, self.config_root, profile=self.profile, overrides=list(self.overrides),
            sets=[*self.sets, *extra], model=self.model, draft=self.draft,
        )  # fmt: skip

    def min_model_len(self) -> int | None:
        """The profile's ``engine.min_model_len`` (the ladder's context floor), as these inputs set it."""
        from ..pipeline import resolve_settings

        try:
            res = resolve_settings(
                self.host, self.config_root, self.profile, list(self.overrides), list(self.sets)
            )
            return res.settings.engine.min_model_len
        except Exception as e:  # a floor unknown is the ladder's own default, not a failed launch
            log.warning("engine.min_model_len not known (%s): the ladder uses its own floor", e)
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.to_dict(), "config_root": self.config_root, "profile": self.profile,
            "overrides": list(self.overrides), "sets": list(self.sets), "model": self.model, "draft": self.draft,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> PlanInputs:
        from ..host.snapshot import HostSnapshot

        return cls(
            HostSnapshot.from_dict(data["host"], source), str(data["config_root"]), data.get("profile"),
            tuple(data.get("overrides") or ()), tuple(data.get("sets") or ()), data.get("model"), data.get("draft"),
        )  # fmt: skip


def write_launch_file(runtime: Path, plan: Plan, inputs: PlanInputs, vllm_version: str) -> Path:
    """The validated plan, its inputs (for re-plans) and the vLLM release, for the detached
    supervisor: ``<runtime>/launch.json``, written atomically, 0600."""
    from ..runtime.files import atomic_write

    path = private_dir(runtime) / LAUNCH_FILE
    doc = {
        "schema": LAUNCH_SCHEMA,
        "vllm_version": vllm_version,
        "plan": plan.to_json(),
        "inputs": inputs.to_json(),
    }
    atomic_write(path, json.dumps(doc, indent=1), 0o600)
    return path


def read_launch_file(path: str | os.PathLike[str]) -> tuple[Plan, PlanInputs, str]:
    """(plan, inputs, vLLM version) from :func:`write_launch_file`'s file; it must be a regular file
    of this user's (not followed if it is a link)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(f"--plan-file {path}: {e.strerror}", 2) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise LaunchError(f"--plan-file {path}: not a regular file of this user's", 2)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("schema") != LAUNCH_SCHEMA:
            raise ValueError(f"schema is not {LAUNCH_SCHEMA}")
        return (
            Plan.from_json(doc["plan"]),
            PlanInputs.from_json(doc["inputs"], str(path)),
            str(doc["vllm_version"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise LaunchError(f"--plan-file {path}: not a launch file: {e}", 2) from None
