"""The Grafana dashboard's queries name only metrics the exporter really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hwprofile.daemon.exporter import NAMES

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "hwprofile.json"
FUNCTIONS = {"max", "by", "increase", "rate", "sum", "avg", "min", "without"}


def test_every_query_names_an_exported_metric() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    used = set()
    for e in exprs:
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", e)  # drop label matchers, ranges, strings
        names = {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if n not in FUNCTIONS and n != "gpu"}
        assert names, e
        unknown = names - set(NAMES)
        assert not unknown, f"{e}: {unknown} is not exported (exporter.NAMES)"
        used |= names
    # the metrics a reader needs first are on the board
    assert {"hwprofile_gpu_temperature_celsius", "hwprofile_gpu_thermal_state", "hwprofile_instance_degrade_level"} <= used
