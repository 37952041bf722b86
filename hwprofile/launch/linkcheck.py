"""The interconnect check before a plan's first start on GPUs whose links were never proven.

A plan's GPU instance with tensor_parallel_size (x pipeline_parallel_size) > 1 carries the recorded
check's decision for its group (:func:`hwprofile.plan.interconnect.apply`); where none is recorded
(``interconnect`` absent, or ``proven`` None), :func:`prove_links` runs the check on those groups
(:func:`hwprofile.interconnect.check.run_check`: an all-reduce with P2P on and off, each run killed
at ``supervise.link_check_deadline_s``), records it for the host (``<config root>/interconnect/``)
and plans again, so that the plan starts with what the check found:

- exact with P2P: unchanged, and the measured bandwidth now feeds the performance model;
- exact only without P2P: the plan's decision starts the group with ``NCCL_P2P_DISABLE=1`` and
  without vLLM's custom all-reduce (a degrade, said in the progress lines and the plan's reasons);
- wrong or hung in every mode: :class:`~.start.Refused`, with what to do (a smaller TP, replicas).

A check that cannot run at all (PyTorch missing in hwprofile's Python: every rank fails to import)
proves nothing either way: the plan starts unproven, with a warning. ``supervise.link_check=false``
or ``--skip-link-check`` (launch, daemon) skips it.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from .start import Refused

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..host.snapshot import HostSnapshot
    from ..pipeline import PlanInputs
    from ..plan.interconnect import Report
    from ..plan.types import Plan

log = logging.getLogger("hwprofile")

# a rank that could not import PyTorch, or a PyTorch without NCCL or CUDA: the check cannot run here
_HARNESS_MISSING = (
    "No module named",
    "ImportError",
    "ModuleNotFoundError",
    "NCCL built in",
    "Torch not compiled with CUDA",
    "No CUDA GPUs are available",
    "Found no NVIDIA driver",
)
ROUNDS = 2  # a re-plan over measured links may choose other groups: those are checked once more


def unproven_groups(plan: Plan) -> list[tuple[int, ...]]:
    """The GPU groups of this node's instances that all-reduce between GPUs and were never proven."""
    out: list[tuple[int, ...]] = []
    for inst in plan.instances:
        ranks = inst.tensor_parallel_size * max(1, int(inst.pipeline_parallel_size))
        if inst.device != "cuda" or ranks <= 1 or inst.headless or len(inst.gpus) <= 1:
            continue
        ic = inst.interconnect or {}
        if ic.get("proven") is None and tuple(inst.gpus) not in out:
            out.append(tuple(inst.gpus))
    return out


def devices_missing(host: HostSnapshot, groups: list[tuple[int, ...]], dev_root: str = "/dev") -> str | None:
    """Why this process cannot reach the groups' GPUs (``/dev/nvidiactl`` or a GPU's ``/dev/nvidiaN``
    is not here: a container without them, a snapshot of another host), else None."""
    import os

    minors = {g.index: g.minor_number for g in host.gpus}
    wanted = ["nvidiactl"] + [f"nvidia{minors[i]}" for g in groups for i in g if minors.get(i) is not None]
    gone = [w for w in dict.fromkeys(wanted) if not os.path.exists(os.path.join(dev_root, w))]
    return f"{', '.join(os.path.join(dev_root, w) for w in gone)} not here" if gone else None


def _cannot_run(report: Report) -> str | None:
    """Why the check could not run at all (every run an error of a missing module), else None."""
    missing = all(r.outcome == "error" and any(m in r.detail for m in _HARNESS_MISSING) for r in report.runs)
    return report.runs[0].detail if report.runs and missing else None


def prove_links(
    plan: Plan,
    inputs: PlanInputs | None,
    *,
    skip: bool = False,
    progress: Callable[[str], None] | None = None,
    runner: Callable[..., Report] | None = None,
    python: str | None = None,
    dev_root: str = "/dev",
) -> Plan:
    """``plan``, or the plan made again once the links of its unproven TP groups were checked and
    recorded (see the module doc); :class:`Refused` where a group is wrong or hung in every mode.
    ``runner``: :func:`~hwprofile.interconnect.check.run_check` (tests hand in one that plants a
    fault); ``python``: the interpreter of the ranks (default hwprofile's own, whose PyTorch is the
    installed vLLM's); ``dev_root``: where the GPUs' device files are looked for."""
    say = progress or (lambda m: print(f"hwprofile: {m}", file=sys.stderr))
    groups = unproven_groups(plan)
    if not groups:
        return plan
    if skip or not plan.supervise.link_check:
        why = "--skip-link-check" if skip else "supervise.link_check is off"
        log.info("interconnect check skipped (%s): GPUs %s start unproven", why, groups)
        return plan
    if inputs is None:
        say(
            f"interconnect: GPUs {groups} were never proven and this start has no inputs to record a check for"
        )
        return plan
    from ..interconnect.check import run_check

    gone = devices_missing(inputs.host, groups, dev_root)
    if gone:
        say(f"interconnect: the check cannot run in this process ({gone}): GPUs {groups} start unproven")
        return plan
    plan, ran = _check_rounds(plan, inputs, runner or run_check, python, say)
    if ran:
        _say_decisions(plan, say)
        _refuse_unsafe(plan)
    return plan


def _check_rounds(
    plan: Plan,
    inputs: PlanInputs,
    run: Callable[..., Report],
    python: str | None,
    say: Callable[[str], None],
) -> tuple[Plan, bool]:
    """Check the unproven groups, record the result and plan again, until none is left (at most
    ``ROUNDS`` rounds: a new plan may form other groups); and whether the check ran (False: it
    cannot run here, the plan as it was)."""
    from ..interconnect.store import save_report
    from ..plan.candidates import host_fingerprint
    from ..plan.interconnect import apply
    from ..runtime.files import WriteError

    host = inputs.host
    deadline = float(plan.supervise.link_check_deadline_s)
    checked: set[tuple[int, ...]] = set()
    for _ in range(ROUNDS):
        todo = [g for g in unproven_groups(plan) if g not in checked]
        if not todo:
            break
        say(
            f"interconnect: GPUs {', '.join(','.join(map(str, g)) for g in todo)} were never proven: checking the "
            f"all-reduce with P2P on and off (at most {2 * len(todo) * deadline:g} s; --skip-link-check to skip)"
        )
        kw: dict[str, Any] = {"python": python} if python else {}
        fresh = run(
            todo,
            fingerprint=host_fingerprint(host),
            backend="nccl",
            deadline_s=deadline,
            driver_version=host.driver.version,
            iommu=host.interconnect.iommu,
            **kw,
        )
        checked.update(todo)
        missing = _cannot_run(fresh)
        if missing:
            say(f"interconnect: the check cannot run here ({missing[:300]}): GPUs start unproven")
            return plan, False
        report = _joined(inputs, fresh)
        try:
            path = save_report(inputs.config_root, host, report)
        except (OSError, WriteError) as e:
            say(f"interconnect: the result is not recorded ({e}): this start uses it, the next checks again")
            plan = apply(plan, report._replace(runs=fresh.runs), "this start's interconnect check", host)
            break
        say(f"interconnect: recorded in {path}; planning again with it")
        plan = inputs.replan()
    return plan, True


def _joined(inputs: PlanInputs, fresh: Report) -> Report:
    """The new runs joined to what the host has recorded and is still current (other groups' runs
    stay; a damaged record, or one of another driver or IOMMU mode, is replaced)."""
    from ..config import ConfigError
    from ..pipeline import load_interconnect
    from ..plan.interconnect import stale

    try:
        old = load_interconnect(inputs.config_root, inputs.host)
    except ConfigError:  # a damaged record is replaced by the new one
        old = None
    if old is not None and stale(old, inputs.host, fresh.fingerprint):
        old = None  # another driver or IOMMU mode: its runs no longer describe the links
    mine = {(tuple(sorted(r.group)), r.p2p) for r in fresh.runs}
    kept = tuple(r for r in (old.runs if old else ()) if (tuple(sorted(r.group)), r.p2p) not in mine)
    return fresh._replace(runs=kept + fresh.runs)


def _refuse_unsafe(plan: Plan) -> None:
    """:class:`Refused` where a TP group's all-reduce was wrong or hung with P2P on and off."""
    unsafe = [i for i in plan.instances if (i.interconnect or {}).get("tp_unsafe")]
    if unsafe:
        raise Refused(
            "; ".join(
                f"{i.name}: the all-reduce across GPUs {','.join(map(str, i.gpus))} was wrong or hung with P2P on "
                f"and off ({'; '.join((i.interconnect or {})['reasons'])})"
                for i in unsafe
            )
            + ". Run TP over fewer GPUs or as replicas (--set layout.tensor_parallel_size=1 or a smaller one), "
            "check ACS/IOMMU (`hwprofile doctor --interconnect`), or start anyway: --skip-link-check"
        )


def _say_decisions(plan: Plan, say: Callable[[str], None]) -> None:
    for inst in plan.instances:
        ic = inst.interconnect or {}
        if ic.get("nccl_p2p_disable") or ic.get("disable_custom_all_reduce"):
            what = [
                w
                for w, on in (
                    ("NCCL_P2P_DISABLE=1", ic.get("nccl_p2p_disable")),
                    ("no custom all-reduce", ic.get("disable_custom_all_reduce")),
                )
                if on
            ]
            say(
                f"interconnect: {inst.name} starts with {' and '.join(what)}: {'; '.join(ic.get('reasons') or ())}"
            )
