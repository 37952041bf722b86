"""Where the interconnect check's result is kept: ``<config root>/interconnect/<fingerprint>.json``
(:func:`hwprofile.pipeline.interconnect_path`), read back and validated by
:func:`hwprofile.pipeline.load_interconnect`."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ..pipeline import interconnect_path
from ..runtime.files import atomic_write

if TYPE_CHECKING:
    from ..host.snapshot import HostSnapshot
    from ..plan.interconnect import Report


def save_report(root: str | os.PathLike[str], host: HostSnapshot, report: Report) -> str:
    """Write ``report`` for ``host`` under ``root`` (the directory is created); returns the path."""
    path = interconnect_path(root, host)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(report.to_dict(), indent=2) + "\n")
    return path
