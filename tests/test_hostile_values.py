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


# -- verify given malformed answers ---------------------------------------------------------------

ANSWERS = json.loads((Path(__file__).parent / "hostile" / "answers.json").read_text())["cases"]


@pytest.fixture(scope="module")
def answering() -> Any:
    """A loopback server answering every POST with ``answering.reply`` (JSON)."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(srv.reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.reply = None  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("case", ANSWERS, ids=[c["id"] for c in ANSWERS])
def test_verify_given_a_malformed_answer_says_so(answering, case) -> None:
    from hwprofile.verify.prompts import Prompt
    from hwprofile.verify.runner import Client, VerifyError

    answering.reply = case["reply"]
    url = f"http://127.0.0.1:{answering.server_address[1]}"
    client = Client(url, "m", 4, logprobs=5, timeout=30.0)
    prompt = Prompt("p1", "text", "hello")
    if "error" in case:
        with pytest.raises(VerifyError) as e:
            client.answer(prompt)
        assert case["error"] in str(e.value) and url in str(e.value)
    else:
        assert client.answer(prompt).top_logprobs is None


# -- --node-rank beyond the plan's nodes ----------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 5, 63])
def test_a_node_rank_beyond_the_plan_is_an_input_error(host_of, empty_root, rank) -> None:
    from hwprofile.pipeline import PlanInputs

    inputs = PlanInputs(host_of("a100-80g-pcie-1x"), str(empty_root), node_rank=rank)
    with pytest.raises(ConfigError, match=f"--node-rank {rank}: node {rank} is not in this plan"):
        inputs.replan()
