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
    zero = {k: {"median": 0.0} for k in ("p50_tpot_ms", "p50_ttft_ms", "output_throughput")}
    doc["plans"][0]["summary"].append(
        {"concurrency": 64, "rounds": 1, "metrics": zero}
    )  # nothing served: left out
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


# -- --image and node addresses -------------------------------------------------------------------

OPTIONS = json.loads((Path(__file__).parent / "hostile" / "options.json").read_text())


@pytest.fixture
def snap_file(host_of, tmp_path: Path) -> Path:
    p = tmp_path / "node.json"
    p.write_text(host_of("a800-pcie-4x-2numa").to_json())
    return p


@pytest.mark.parametrize("case", OPTIONS["image"], ids=[c["id"] for c in OPTIONS["image"]])
def test_an_image_that_is_no_image_reference_is_refused(snap_file, empty_root, tmp_path, case) -> None:
    import inproc

    image = case["image"] + "a" * case.get("repeat", 0)
    env = {"HWPROFILE_CONFIG_ROOT": str(empty_root)}
    out = tmp_path / "k8s"
    r = inproc.hwprofile(
        [
            "render",
            "--from",
            str(snap_file),
            "--format",
            "k8s",
            "--output",
            str(out),
            f"--image={image}",
            "--vllm-version",
            "0.32.0",
        ],
        env,
    )
    assert r.returncode == 2 and "--image" in r.stderr and "container image reference" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_a_good_image_reference_is_taken(snap_file, empty_root, tmp_path) -> None:
    import inproc

    image = "registry.example.com:5000/team/vllm-openai:v0.32.0@sha256:" + "0" * 64
    out = tmp_path / "k8s"
    r = inproc.hwprofile(
        [
            "render",
            "--from",
            str(snap_file),
            "--format",
            "k8s",
            "--output",
            str(out),
            "--image",
            image,
            "--vllm-version",
            "0.32.0",
        ],
        {"HWPROFILE_CONFIG_ROOT": str(empty_root)},
    )
    assert r.returncode == 0, r.stderr
    assert any(image in p.read_text() for p in out.rglob("*.yaml"))


@pytest.mark.parametrize("case", OPTIONS["addresses"], ids=[c["id"] for c in OPTIONS["addresses"]])
def test_an_address_that_is_no_host_is_refused(snap_file, empty_root, tmp_path, case) -> None:
    import inproc

    env = {"HWPROFILE_CONFIG_ROOT": str(empty_root)}
    if "inventory" in case:
        addrs = case["inventory"]
        if len(addrs) == 3:  # [first, label, length]: a label repeated past 253 characters
            addrs = [addrs[0], (addrs[1] * addrs[2])[: addrs[2]]]
        inv = tmp_path / "nodes.yaml"
        inv.write_text(
            "nodes:\n" + "".join(f"  - {{snapshot: {snap_file}, address: {json.dumps(a)}}}\n" for a in addrs)
        )
        args = ["plan", "--inventory", str(inv)]
        says = "address"
    else:
        args = ["plan", "--from", str(snap_file), "--from", str(snap_file), "--set", case["set"]]
        says = "layout.master_addr"
    r = inproc.hwprofile(args, env)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
