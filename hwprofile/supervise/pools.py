"""The KV cache pool vLLM measured at a start, recorded for a later pin (``supervise.pin_kv_pool``;
the records and the choice are :mod:`hwprofile.plan.kvpin`'s, the pipeline reads them back).

One file per state directory (``kv-pools.json``), read, extended and replaced atomically under a lock
of this process (the instances' threads record at their own readiness)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from ..plan.kvpin import KEEP, add_record, measured_bytes, pool_key
from ..plan.types import InstancePlan, Plan
from ..runtime.dirs import private_dir
from ..runtime.files import UnsafeFile, atomic_write, read_bounded

log = logging.getLogger("hwprofile")
_LOCK = threading.Lock()
CAP = 4 * 2**20


def record(
    path: Path, plan: Plan, inst: InstancePlan, started: dict[str, Any], at: float | None = None
) -> int | None:
    """Record the pool of this start (``started``: :func:`.verify.parse_startup`'s answer) under
    ``inst``'s key; the bytes recorded, or None where this start measured none (a CPU instance, a
    pinned start, a log without the line). A file that cannot be written is said in the log, once
    per start: a pin is an optimisation, never a reason to fail."""
    gib = started.get("kv_pool_gib")
    if gib is None or inst.device != "cuda":
        return None
    nbytes = measured_bytes(gib)
    key = pool_key(plan, inst)
    with _LOCK:
        try:
            private_dir(path.parent)
            try:
                doc: Any = json.loads(read_bounded(path, CAP))
            except FileNotFoundError:
                doc = None
            except (ValueError, UnicodeDecodeError):
                doc = None  # not ours to keep: replaced
            new = add_record(
                doc, key, nbytes, time.time() if at is None else at, started.get("compile") or "unknown"
            )
            atomic_write(path, json.dumps(new, indent=1, sort_keys=True), mode=0o600)
        except (OSError, UnsafeFile) as e:
            log.error("%s: cannot record the KV cache pool vLLM measured in %s: %s", inst.name, path, e)
            return None
    log.info(
        "%s: vLLM measured %s GiB for the KV cache (%s compile cache): recorded for supervise.pin_kv_pool "
        "(the newest %d per instance)",
        inst.name,
        gib,
        started.get("compile") or "unknown",
        KEEP,
    )
    return nbytes
