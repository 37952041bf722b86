"""``hwprofile verify`` without real vLLM: the comparison on hand-computed cases, the prompt files
(the shipped set and broken ones, with file:line), the report against its schema, and the command
against fake vLLM servers (tests/fakevllm.py): two running servers (``--baseline-url``/``--url``), and
both plans served one after the other through the supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import runcli
from vllmtools import FAKE_VLLM, fake_model, fake_vllm_shim, free_port

from hwprofile.config import ConfigError
from hwprofile.verify.compare import Answer, Verdict, compare, divergence, first_difference, similarity
from hwprofile.verify.prompts import KINDS, Prompt, load_prompts
from hwprofile.verify.report import format_text, to_json

ROOT = Path(__file__).resolve().parent.parent
FAKE = FAKE_VLLM
SCHEMA = json.loads((ROOT / "schemas" / "hwprofile.verify-1.schema.json").read_text())


# -- the comparison ----------------------------------------------------------------------------------


def test_similarity_is_the_token_sequence_ratio() -> None:
    assert similarity([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert similarity([], []) == 1.0
    assert similarity([1, 2], []) == 0.0
    assert similarity([1, 2, 3, 4], [1, 2, 9, 4]) == pytest.approx(2 * 3 / 8)  # 3 of 4 match
    assert similarity([1, 2, 3], [1, 2, 3, 4, 5]) == pytest.approx(2 * 3 / 8)  # a shorter answer
    assert similarity([1, 2, 3, 4], [9, 9, 9, 9]) == 0.0


def test_similarity_does_not_drop_frequent_tokens() -> None:
    # A 300-token answer of two alternating tokens (repetitive output is common) with one changed:
    # 299 of 300 match on each side. difflib's autojunk would treat both tokens as junk (each is more
    # than 1 % of a sequence of 200 or more) and say 0.5.
    a = [5, 6] * 150
    b = list(a)
    b[150] = 9
    assert similarity(a, b) == pytest.approx(2 * 299 / 600)
    import difflib

    assert difflib.SequenceMatcher(None, a, b).ratio() == pytest.approx(0.5)  # what autojunk would say


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # the baseline ended (EOS) first
    assert first_difference([], [4]) == 0


def test_divergence_ranks_the_candidate_token_by_the_baseline_logprobs() -> None:
    top = ({1: -0.1}, {2: -0.4, 7: -0.45, 8: -2.0}, {3: -0.2})
    base = Answer((1, 2, 3), " a b c", "length", top)
    cand = Answer((1, 7, 4), " a x y", "length")
    d = divergence(base, cand, {2: " b", 7: " x"}.get)
    assert d is not None and d.index == 1
    assert (d.baseline.token_id, d.baseline.text, d.candidate.token_id, d.candidate.text) == (
        2,
        " b",
        7,
        " x",
    )
    assert (d.baseline_logprob, d.candidate_logprob, d.candidate_rank) == (-0.4, -0.45, 2)
    assert d.margin == pytest.approx(0.05)
    # a token the baseline did not have among its top ones: no rank, no margin
    d = divergence(base, Answer((1, 9), " a z"), None)
    assert d is not None and (d.candidate_logprob, d.candidate_rank, d.margin, d.candidate.text) == (
        None,
        None,
        None,
        None,
    )
    # the candidate stopped early: its side is empty
    d = divergence(base, Answer((1,), " a", "stop"))
    assert d is not None and d.index == 1 and d.candidate.token_id is None and d.baseline.token_id == 2
    assert divergence(base, Answer((1, 2, 3), "")) is None


def _p(i: int, kind: str = "en") -> Prompt:
    return Prompt(f"p{i}", kind, f"prompt {i}")


def test_verdict_mean_exact_rate_bar_and_kinds() -> None:
    prompts = [_p(1, "en"), _p(2, "en"), _p(3, "zh")]
    base = [Answer((1, 2, 3, 4), ""), Answer((5, 6), ""), Answer((1, 2, 3, 4), "")]
    cand = [Answer((1, 2, 3, 4), ""), Answer((5, 6), ""), Answer((1, 2, 9, 4), "")]
    v = compare(prompts, base, cand, 0.9)
    assert (v.prompts, v.exact_matches) == (3, 2)
    assert v.exact_match_rate == pytest.approx(2 / 3)
    assert v.similarity == pytest.approx((1 + 1 + 0.75) / 3)  # 0.9167
    assert v.passed
    assert not Verdict(v.results, 0.92).passed
    assert v.by_kind() == {
        "en": {"prompts": 2, "exact_matches": 2, "similarity": 1.0},
        "zh": {"prompts": 1, "exact_matches": 0, "similarity": 0.75},
    }
    assert [r.exact for r in v.results] == [True, True, False]
    assert v.results[2].divergence is not None and v.results[2].divergence.index == 2
    with pytest.raises(ValueError):
        compare(prompts, base, cand[:2], 0.9)


def test_identical_answers_pass_even_the_strictest_bar() -> None:
    prompts = [_p(i) for i in range(4)]
    ans = [Answer((i, i + 1), "") for i in range(4)]
    v = compare(prompts, ans, list(ans), 1.0)
    assert v.passed and v.exact_match_rate == 1.0 and v.similarity == 1.0


# -- the prompts -------------------------------------------------------------------------------------


def test_the_shipped_prompts() -> None:
    ps = load_prompts()
    assert ps.source.endswith("hwprofile/data/verify_prompts.yaml")
    assert len(ps.prompts) == 50
    assert {k: sum(p.kind == k for p in ps.prompts) for k in KINDS} == dict.fromkeys(KINDS, 10)
    assert len({p.id for p in ps.prompts}) == 50
    assert all(p.text.strip() and p.line for p in ps.prompts)
    zh = [p for p in ps.prompts if p.kind == "zh"]
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in p.text) for p in zh)
    assert all("json" in p.text.lower() or "JSON" in p.text for p in ps.prompts if p.kind == "json")


def _errors(tmp_path: Path, text: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_prompts(f)
    return str(e.value)


def test_a_user_file_is_read(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(
        "prompts:\n  - id: a\n    kind: en\n    text: hello\n  - id: b\n    kind: code\n    text: |\n      def f():\n"
    )
    ps = load_prompts(f)
    assert [(p.id, p.kind, p.text, p.line) for p in ps.prompts] == [
        ("a", "en", "hello", 2),
        ("b", "code", "def f():\n", 5),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", ["p.yaml:1: expected a mapping with a `prompts:` list, found a list"]),
        ("prompts: []\n", ["p.yaml:1: `prompts` must be a non-empty list"]),
        ("prompt:\n  - id: a\n", ["p.yaml:1: unknown key 'prompt'", "`prompts` must be a non-empty list"]),
        (
            "prompts:\n  - id: a\n    kind: fr\n    text: salut\n",
            ["p.yaml:3: kind 'fr' is not one of zh, en, code, math, json"],
        ),
        ("prompts:\n  - id: a\n    kind: en\n", ["p.yaml:2: prompt 1 has no 'text'"]),
        ("prompts:\n  - id: a\n    kind: en\n    text: ''\n", ["p.yaml:4: text must be a non-empty string"]),
        (
            "prompts:\n  - id: a\n    kind: en\n    text: x\n    tokens: 3\n",
            ["p.yaml:5: unknown key 'tokens'"],
        ),
        (
            "prompts:\n  - id: a\n    kind: en\n    text: x\n  - id: a\n    kind: zh\n    text: y\n",
            ["p.yaml:5: duplicate id 'a' (first at", "p.yaml:2)"],
        ),
        (
            "prompts:\n  - id: 7\n    kind: en\n    text: x\n",
            ["p.yaml:2: id must be a non-empty string, found 7"],
        ),
        ("prompts:\n  - just text\n", ["p.yaml:2: a prompt must be a mapping"]),
        ("schema: other/1\nprompts:\n  - {id: a, kind: en, text: x}\n", ["p.yaml:1: schema 'other/1'"]),
        ("prompts:\n  - id: a\n    kind: en\n    text: x: y\n", ["p.yaml:4: invalid YAML"]),
        ("prompts:\n  - &p {id: a, kind: en, text: x}\n  - *p\n", ["p.yaml:3: YAML anchors and aliases"]),
        ("prompts:\n  - id: a\n    id: b\n", ["p.yaml:3: duplicate key"]),
    ],
)
def test_bad_prompt_files_name_file_and_line(tmp_path: Path, text: str, expected: list[str]) -> None:
    msg = _errors(tmp_path, text)
    for part in expected:
        assert part in msg, msg


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    msg = _errors(tmp_path, "prompts:\n  - {id: a, kind: xx, text: x}\n  - {id: b, kind: en}\n")
    assert "p.yaml:2: kind 'xx'" in msg and "p.yaml:3: prompt 2 has no 'text'" in msg


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_prompts(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_prompts(tmp_path / "missing.yaml")


# -- the report --------------------------------------------------------------------------------------


def _doc(verdict: Verdict) -> dict:
    side = {"source": "url", "url": "http://127.0.0.1:1", "model": "m", "seconds": 1.5, "plan": None}
    settings = {
        "endpoint": "/v1/completions",
        "max_tokens": 4,
        "temperature": 0,
        "seed": 0,
        "concurrency": 1,
        "baseline_top_logprobs": 5,
        "prompts_file": "x.yaml",
    }
    return to_json(verdict, side, side, settings, ["a note"])


def test_report_json_follows_the_schema_and_the_text_says_the_verdict() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    top = ({1: -0.1}, {2: -0.4, 7: -0.45})
    v = compare(
        [_p(1), _p(2, "math")],
        [Answer((1, 2), "", "length", top), Answer((3,), "", "stop")],
        [Answer((1, 7), "", "length"), Answer((3,), "", "stop")],
        0.992,
        {2: " b", 7: " x"}.get,
    )
    doc = _doc(v)
    jsonschema.validate(doc, SCHEMA)
    assert (
        doc["passed"] is False
        and doc["exact_matches"] == 1
        and doc["similarity"]["value"] == pytest.approx(0.75)
    )
    diff = doc["results"][0]["first_difference"]
    assert diff["index"] == 1 and diff["candidate"] == {"token_id": 7, "text": " x"}
    assert diff["candidate_rank_at_baseline"] == 2 and diff["margin"] == pytest.approx(0.05)
    text = format_text(doc)
    assert text.startswith("FAIL: similarity 0.7500 (bar 0.992), exact match 1/2 (50.0%)")
    assert "p1         token 1 of 2/2: baseline 2 ' b', candidate 7 ' x'" in text
    assert "ranked the candidate's token 2 (0.0500 nats below its own)" in text
    assert "note: a note" in text
    bad = dict(doc, similarity=dict(doc["similarity"], value=1.5))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


# -- the command against fake servers ----------------------------------------------------------------


@pytest.fixture
def world() -> Iterator[dict]:
    """A short scratch directory (vLLM's IPC socket paths fit 107 bytes) with a fake model, an empty
    config root and the environment for hwprofile (no proxies, no FAKEVLLM_* from outside)."""
    base = Path(tempfile.mkdtemp(prefix="hwpv-", dir="/tmp"))
    model = fake_model(base / "model")
    (base / "etc").mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HWPROFILE_", "FAKEVLLM_", "FAKE_NVML"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    env.update(
        HWPROFILE_CONFIG_ROOT=str(base / "etc"),
        FAKEVLLM_TOKEN_DELAY="0",
        FAKEVLLM_READY_DELAY="0.2",
        http_proxy="http://127.0.0.1:9",
        FAKEVLLM_ARGV_LOG=str(base / "starts.jsonl"),
    )
    procs: list[subprocess.Popen[bytes]] = []
    yield {"base": base, "model": model, "env": env, "procs": procs}
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def fake_server(world: dict, *flags: str) -> str:
    """A fake vLLM started by hand (as docker or k8s would); its URL once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "serve",
            str(world["model"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ],
        env=world["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    world["procs"].append(proc)
    url = f"http://127.0.0.1:{port}"
    from hwprofile.telemetry.http import healthy

    end = time.monotonic() + 20
    while not healthy(url):
        assert proc.poll() is None and time.monotonic() < end, "the fake server did not start"
        time.sleep(0.05)
    return url


def hw(world: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return runcli.hwprofile("verify", *args, env=world["env"], timeout=timeout, cwd=ROOT)


def test_two_identical_servers_pass(world: dict) -> None:
    a, b = fake_server(world), fake_server(world)
    r = hw(world, "--baseline-url", a, "--url", b, "--max-tokens", "16", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert (
        doc["passed"] and doc["exact_matches"] == doc["prompts"] == 50 and doc["similarity"]["value"] == 1.0
    )
    assert all(x["baseline_tokens"] == 16 and x["first_difference"] is None for x in doc["results"])
    assert doc["baseline"]["model"] == str(world["model"]) and doc["settings"]["max_tokens"] == 16
    assert "50/50 prompts answered" in r.stderr  # through http_proxy=127.0.0.1:9 it would not have


def test_a_planted_difference_is_caught_with_its_first_token(world: dict) -> None:
    a = fake_server(world)
    b = fake_server(world, "--fake-diverge-after", "5", "--fake-diverge-match", "JSON")
    r = hw(world, "--baseline-url", a, "--url", b, "--max-tokens", "20", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    prompts = load_prompts().prompts
    planted = {p.id for p in prompts if "JSON" in p.text}
    assert planted and {x["id"] for x in doc["results"] if not x["exact"]} == planted
    assert doc["exact_matches"] == 50 - len(planted)
    # the diverged answers keep 5 of 20 tokens (the continuation after them is another one)
    for x in doc["results"]:
        if x["id"] in planted:
            d = x["first_difference"]
            assert d["index"] == 5 and d["baseline"]["token_id"] != d["candidate"]["token_id"]
            assert d["candidate"]["text"] == f" w{d['candidate']['token_id']}"  # from /detokenize
            assert d["candidate_rank_at_baseline"] == 2 and d["margin"] == pytest.approx(0.002)
            assert x["similarity"] < 0.5
    assert not doc["passed"] and doc["similarity"]["value"] < 0.992
    text = hw(world, "--baseline-url", a, "--url", b, "--max-tokens", "20")
    assert text.returncode == 1 and text.stdout.startswith("FAIL: similarity")
    assert f"divergent answers ({len(planted)}):" in text.stdout


def test_a_late_single_difference_is_reported_but_within_the_bar(world: dict) -> None:
    a = fake_server(world)
    b = fake_server(world, "--fake-diverge-after", "127", "--fake-diverge-match", "2 TB/s")
    r = hw(world, "--baseline-url", a, "--url", b, "--json")  # verify.max_tokens: 128
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["exact_matches"] == 49 and doc["settings"]["max_tokens"] == 128
    (x,) = (x for x in doc["results"] if not x["exact"])
    assert x["id"] == "math-09" and x["first_difference"]["index"] == 127
    assert doc["similarity"]["value"] == pytest.approx((49 + 2 * 127 / 256) / 50)
    # the bar is verify.min_similarity: 1.0 asks for identical answers
    strict = hw(world, "--baseline-url", a, "--url", b, "--set", "verify.min_similarity=1", "--json")
    assert strict.returncode == 1 and json.loads(strict.stdout)["similarity"]["min"] == 1.0


def test_a_user_prompts_file_and_the_limit(world: dict) -> None:
    a, b = fake_server(world), fake_server(world, "--fake-diverge-after", "0")
    f = world["base"] / "mine.yaml"
    f.write_text(
        "prompts:\n" + "".join(f"  - {{id: q{i}, kind: math, text: '{i} + {i}'}}\n" for i in range(5))
    )
    r = hw(
        world,
        "--baseline-url",
        a,
        "--url",
        b,
        "--prompts",
        str(f),
        "--limit",
        "3",
        "--max-tokens",
        "4",
        "--json",
    )
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert [x["id"] for x in doc["results"]] == ["q0", "q1", "q2"] and doc["settings"]["prompts_file"] == str(
        f
    )
    assert doc["exact_matches"] == 0 and all(x["first_difference"]["index"] == 0 for x in doc["results"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://127.0.0.1:1"], "--baseline-url and --url go together"),
        (["--demo", "--baseline-url", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2"], "--demo serves"),
        (["--max-tokens", "0"], "argument --max-tokens: 0 is not from 1 to 65536"),
        (["--limit", "0"], "argument --limit: 0 is not from 1"),
        (["--set", "verify.min_similarity=2"], "verify.min_similarity"),
    ],
)
def test_bad_input_exits_2(world: dict, args: list[str], message: str) -> None:
    r = hw(world, *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_bad_prompts_file_exits_2_with_file_and_line(world: dict) -> None:
    f = world["base"] / "bad.yaml"
    f.write_text(
        "prompts:\n  - id: a\n    kind: en\n    text: x\n  - id: b\n    kind: klingon\n    text: y\n"
    )
    r = hw(world, "--prompts", str(f), "--baseline-url", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2")
    assert r.returncode == 2 and f"{f}:6: kind 'klingon'" in r.stderr, r.stderr


def test_a_server_that_does_not_answer_exits_1(world: dict) -> None:
    a = fake_server(world)
    r = hw(world, "--baseline-url", a, "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "nothing answered at /v1/models" in r.stderr, r.stderr


def _shim(world: dict, diverge_speculative: bool) -> Path:
    """``server.vllm_command``: the fake, with a planted difference only in a server that speculates."""
    shim = world["base"] / ("vllm-diverging" if diverge_speculative else "vllm")
    plant = 'case "$*" in *--speculative-config*) export FAKEVLLM_DIVERGE_AFTER=2;; esac\n'
    return fake_vllm_shim(shim, plant if diverge_speculative else "")


@pytest.mark.parametrize("diverge", [False, True])
def test_serves_the_baseline_then_the_tuned_plan(world: dict, diverge: bool) -> None:
    port = free_port()
    sets = [
        "engine.max_model_len=512",
        "cpu.kv_cache_space_gib=0.0625",
        f"server.port={port}",
        "server.shutdown_timeout=2",
        f"server.vllm_command={_shim(world, diverge)}",
        f"logs.dir={world['base'] / 'logs'}",
        "speculative.method=ngram",
    ]
    r = hw(
        world,
        "--model",
        str(world["model"]),
        *[w for s in sets for w in ("--set", s)],
        "--runtime-dir",
        str(world["base"] / "rt"),
        "--limit",
        "6",
        "--max-tokens",
        "8",
        "--json",
    )
    assert r.returncode == (1 if diverge else 0), r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["baseline"]["source"] == doc["candidate"]["source"] == "served"
    assert doc["baseline"]["plan"]["speculative"] is None
    assert doc["candidate"]["plan"]["speculative"]["method"] == "ngram"
    assert doc["baseline"]["plan"]["dtype"] == doc["candidate"]["plan"]["dtype"]
    assert doc["baseline"]["url"] == doc["candidate"]["url"] == f"http://127.0.0.1:{port}"
    assert doc["exact_matches"] == (0 if diverge else 6) and doc["prompts"] == 6
    if diverge:
        assert {x["first_difference"]["index"] for x in doc["results"]} == {2}
    # one after the other on the same port (both at once could not bind it): baseline first
    starts = [json.loads(line) for line in (world["base"] / "starts.jsonl").read_text().splitlines()]
    assert len(starts) == 2
    assert "--speculative-config" not in starts[0]["argv"] and "--speculative-config" in starts[1]["argv"]
    from hwprofile.runtime.processes import pid_alive

    assert not any(pid_alive(s["pid"]) for s in starts)  # both stopped


# -- a server that refuses log-probabilities ---------------------------------------------------------


def test_client_asks_again_without_logprobs_where_the_server_refuses_them() -> None:
    """An HTTP 400 to a request with ``logprobs``: the client notes it and asks again without; another
    error status is a VerifyError naming the status."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hwprofile.verify.runner import Client, VerifyError

    bodies: list[dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if body.get("prompt") == "broken":
                status, reply = 503, b"overloaded"
            elif "logprobs" in body:
                status, reply = 400, b"logprobs are not supported"
            else:
                choice = {"text": "hi", "token_ids": [7, 8], "finish_reason": "length"}
                status, reply = 200, json.dumps({"choices": [choice]}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{server.server_port}", "m", 2, logprobs=5, timeout=30.0)
        answer = client.answer(Prompt("p1", "code", "hello"))
        assert answer.token_ids == (7, 8) and answer.text == "hi"
        assert ["logprobs" in b for b in bodies] == [True, False]
        assert client.logprobs is None and "refused logprobs (logprobs are not supported)" in client.notes[0]
        with pytest.raises(VerifyError, match=r"HTTP 503: overloaded"):
            client.answer(Prompt("p2", "code", "broken"))
    finally:
        server.shutdown()
        server.server_close()
