"""The ``hwprofile.host/1`` contract published as JSON Schema (draft 2020-12): what
schemas/hwprofile.host-1.schema.json holds (a test keeps the file equal to :func:`json_schema`).

Regenerate the file with::

    python -c "import json, hwprofile.host.snapshot_schema as s; print(json.dumps(s.json_schema(), indent=2, ensure_ascii=False))" > schemas/hwprofile.host-1.schema.json

Not imported by detection or by loading a snapshot: only by whoever asks for the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .snapshot import MAX_CPUS, MAX_SNAPSHOT_BYTES
from .snapshot_check import HOST

if TYPE_CHECKING:
    from typing import Any


def json_schema() -> dict[str, Any]:
    """The contract as JSON Schema (draft 2020-12); cross-field rules are in its description."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/hwprofile/hwprofile/schemas/hwprofile.host-1.schema.json",
        "title": "hwprofile host snapshot (hwprofile.host/1)",
        "description": (
            "What `hwprofile detect --json` prints and `--from FILE` reads. Unknown values are null; "
            "keys not listed here are ignored. Also checked at load, beyond this schema: integers are "
            "JSON integers (not 1.0); GPU indexes and NUMA node ids are unique; gpu_links name existing, "
            "distinct GPUs, each pair once; no two GPUs share a minor_number; a GPU's numa_node is one of numa_nodes' ids (when any are "
            "listed); no CPU is on two NUMA nodes; CPU ranges ascend and stay below "
            f"{MAX_CPUS}; memory used and reserved are at most the total; PCIe gen and width are at "
            f"most their maximum; the file is UTF-8, at most {MAX_SNAPSHOT_BYTES} bytes, without "
            "duplicate keys, NaN, Infinity or lone surrogates (\\udc80) in strings."
        ),
        **HOST.schema(),
    }
