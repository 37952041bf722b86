"""``hwprofile launch``, ``status`` and ``stop``: from a plan to supervised vLLM processes, with side
effects (directories, the launch file, the detached supervisor, signals).

- :mod:`.prepare`: hwprofile's log, the runtime and log directories, the supervisor's options, the
  refusals before a start (a supervisor running, a port taken);
- :mod:`.inputs`: what a plan is made from (re-plans) and the launch file;
- :mod:`.run`: supervising in the foreground, starting a detached supervisor, the demo's completion;
- :mod:`.status`: what runs, checked, and its text; :mod:`.stop`: stopping it.

The names other modules use are here too (``from hwprofile.launch import options``).
"""

from __future__ import annotations

from .inputs import LAUNCH_FILE, LAUNCH_SCHEMA, PlanInputs, read_launch_file, write_launch_file
from .prepare import (
    LaunchError,
    check_not_running,
    check_ports,
    log_root,
    options,
    prepare_dirs,
    setup_logging,
)
from .run import demo_completion, run_detached, run_foreground
from .status import format_status, status
from .stop import stop

__all__ = [
    "LAUNCH_FILE", "LAUNCH_SCHEMA", "LaunchError", "PlanInputs", "check_not_running", "check_ports",
    "demo_completion", "format_status", "log_root", "options", "prepare_dirs", "read_launch_file",
    "run_detached", "run_foreground", "setup_logging", "status", "stop", "write_launch_file",
]  # fmt: skip
