"""Before anything starts: hwprofile's own log, the runtime and log directories (checked, made
private), the supervisor's options from the plan's settings, and the refusals (a supervisor already
running, a port taken)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OperationError
from ..plan.types import Plan
from ..runtime.dirs import UnsafeDirectory, private_dir, user_dirname
from ..supervise.state import STATE_FILE, already_message, lock_held, read_state

if TYPE_CHECKING:
    from ..supervise.supervisor import Options

log = logging.getLogger("hwprofile")


class LaunchError(OperationError):
    """A launch refused or failed; ``code`` is the exit status (2: the input, 1: the host)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def setup_logging(runtime: Path, to_stderr: bool) -> None:
    """hwprofile's own log: ``<runtime>/hwprofile.log``, and stderr too (without vLLM's lines, which
    are in the instances' log files) when ``to_stderr``."""
    private_dir(runtime)
    handlers: list[logging.Handler] = [logging.FileHandler(runtime / "hwprofile.log")]
    if to_stderr:
        console = logging.StreamHandler(sys.stderr)
        console.addFilter(
            lambda record: not record.name.startswith("hwprofile.vllm")
        )  # those are in the log files
        handlers.append(console)
    fmt = logging.Formatter("%(asctime)s hwprofile %(levelname)s %(message)s")
    for h in list(log.handlers):
        log.removeHandler(h)
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def log_root(plan: Plan, tmpfs: str | None, runtime: Path) -> Path:
    """Where the instances' logs go: hwprofile's own per-user directory (:func:`user_dirname`) inside
    ``logs.dir`` or the tmpfs, never the given directory itself (whose mode hwprofile leaves alone);
    the runtime directory's ``logs`` without either."""
    configured = plan.logs.dir
    if configured:
        return Path(configured) / user_dirname()
    if tmpfs:
        return Path(tmpfs) / user_dirname()
    log.warning("no tmpfs found: instance logs go to %s (on disk)", runtime / "logs")
    return runtime / "logs"


def prepare_dirs(plan: Plan, tmpfs: str | None, runtime: Path) -> None:
    """Create (or check) the runtime and log directories before anything starts, so that one hwprofile
    may not use (a link, another user's, writable by others) is refused here, with the reason."""
    try:
        private_dir(runtime)
        private_dir(log_root(plan, tmpfs, runtime))
    except UnsafeDirectory as e:
        raise LaunchError(str(e)) from None


def options(
    plan: Plan,
    tmpfs: str | None,
    runtime: Path,
    progress: Callable[[str], None] | None = None,
    min_model_len: int | None = None,
) -> Options:
    """The supervisor's options for ``plan``: its ``supervise`` and ``logs`` settings, the log root
    (:func:`log_root`), ``progress`` (a line per start-up note) and the ladder's context floor."""
    from ..supervise.supervisor import Options

    return Options.from_settings(
        plan.supervise, plan.logs, runtime, log_root(plan, tmpfs, runtime),
        progress=progress, min_model_len=min_model_len,
    )  # fmt: skip


def check_not_running(runtime: Path) -> None:
    """Refuse when a supervisor holds this runtime directory's lock (the supervisor takes the lock
    itself too, so two launches racing past this check cannot both supervise)."""
    if lock_held(runtime):
        raise LaunchError(already_message(runtime), 2)
    state = read_state(runtime / STATE_FILE)
    if state is not None:
        print(
            f"hwprofile: note: {runtime / STATE_FILE} is stale (supervisor pid {state.get('supervisor_pid')} "
            "is gone); it is replaced",
            file=sys.stderr,
        )


def check_ports(plan: Plan) -> None:
    """Refuse when a port the plan's instances need is taken, saying how to find what holds it."""
    from ..supervise.supervisor import port_free

    for inst in plan.instances:
        s = inst.server
        if not port_free(s.host, s.port):
            raise LaunchError(
                f"{inst.name}: port {s.port} on {s.host} is already in use. Stop what holds it "
                f"(`ss -ltnp 'sport = :{s.port}'`), or choose another: --set server.port=<free port>"
            )
