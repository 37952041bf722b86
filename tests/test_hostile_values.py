"""Values hwprofile used to take as given (tests/hostile/calibration.json and the cases below): a
calibration file is a measurement, checked as one (types, finite, positive, plausible), else an error
naming the file; a ``--node-rank`` beyond the plan's nodes, ``verify`` given malformed answers,
``--image`` with a newline, a space or 4,096 characters, an address starting with ``-``: each a clear
error naming the input (exit 2), never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_predict import _bench_doc

from hwprofile.config import ConfigError
from hwprofile.pipeline import calibration_path, make_plan

CAL = json.loads((Path(__file__).parent / "hostile" / "calibration.json").read_text())["cases"]


def _set(doc: Any, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for k in path:
        doc = doc[int(k)] if isinstance(doc, list) else doc[k]
    doc[int(last) if isinstance(doc, list) else last] = value


@pytest.mark.parametrize("case", CAL, ids=[c["id"] for c in CAL])
def test_a_calibration_that_is_no_measurement_is_refused(host_of, empty_root, case) -> None:
    host = host_of("a800-pcie-4x-2numa")
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = copy.deepcopy(_bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0))
    if "literal" in case:
        _set(doc, case["set"], "@@LITERAL@@")
        literal = "[" * 50_000 + "]" * 50_000 if case["literal"] == "DEEP" else case["literal"]
        path.write_text(json.dumps(doc).replace('"@@LITERAL@@"', literal))
    else:
        _set(doc, case["set"], case["value"])
        path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        make_plan(host, empty_root, environ={})
    assert str(path) in str(e.value) and case["says"] in str(e.value), str(e.value)


def test_a_good_calibration_still_plans(host_of, empty_root) -> None:
    host = host_of("a800-pcie-4x-2numa")
    path = Path(calibration_path(empty_root, host))
    path.parent.mkdir()
    doc = _bench_doc(host, tpot=30.0, ttft=250.0, tps=480.0)
    doc["plans"][0]["summary"].append({"concurrency": 32, "rounds": 1})  # a round that failed: left out
    path.write_text(json.dumps(doc))
    plan = make_plan(host, empty_root, environ={}).to_json()
    assert plan["prediction"]["calibration"]["path"] == str(path)
    assert plan["instances"][0]["prediction"]["tpot_ms"] == 30.0
