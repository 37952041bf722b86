"""The out-of-memory ladder, re-planned: :func:`.failures.next_rung` names the next step; here the
planner is asked again with every step so far, and a step whose re-plan is refused, or moves the
instance to other GPUs or another port, is skipped for the next one.

No processes, no files: the caller's ``replan`` function is the only thing called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..plan.types import InstancePlan, Plan
from .failures import Rung, ladder_sets, next_rung

log = logging.getLogger("hwprofile")


def replan_step(
    name: str,
    inst: InstancePlan,
    taken: list[Rung],
    refused: list[Rung],
    min_model_len: int,
    replan: Callable[[list[str]], Plan] | None,
) -> tuple[Rung, Plan, InstancePlan] | str:
    """The next ladder step for instance ``name`` (planned as ``inst``, after the steps ``taken``),
    re-planned: (step, the new plan, this instance in it); or, when there is none, what to do
    instead. Each step skipped is appended to ``refused`` (not tried again)."""
    while True:
        step = next_rung(inst, [*taken, *refused], min_model_len)
        if step is None:
            return "every ladder step taken; a smaller model, a 4-bit checkpoint or another GPU"
        if replan is None:
            return f"the next ladder step is --set {step.set}; this supervisor cannot re-plan: launch again with it"
        sets = ladder_sets([*taken, step])
        try:
            plan = replan(sets)
        except Exception as e:  # a refused re-plan: this step cannot be taken
            why = f"{type(e).__name__}: {getattr(e, 'message', None) or e}"
        else:
            new = next((i for i in plan.instances if i.name == name), None)
            if new is None:
                why = "the re-plan has no instance of this name"
            elif (new.gpus, new.tensor_parallel_size, new.server.host, new.server.port) != (
                inst.gpus,
                inst.tensor_parallel_size,
                inst.server.host,
                inst.server.port,
            ):
                why = "the re-plan moves this instance to other GPUs or another port"
            else:
                return step, plan, new
        log.warning("%s: ladder step %s skipped: %s", name, step.set, str(why)[:300])
        refused.append(step)


def step_change(step: Rung, new: InstancePlan) -> str:
    """What ``step`` changes, as status shows it; with what the planner chose when that differs from
    the step's own value (``new`` is the instance re-planned with it)."""
    section, _, rest = step.set.partition(".")
    key, _, wanted = rest.partition("=")
    change = step.change
    if section == "engine":
        got = getattr(new.engine, key, None)
        if str(got).lower() != wanted.lower():
            change += f" (planned: {got})"
    return change
