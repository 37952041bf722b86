"""The hwprofile.plan/1 contract (schemas/hwprofile.plan-1.schema.json) holds for real plans: every
fixture host with several models, a refusal, and the CLI's own --json output."""

from __future__ import annotations

import json
from pathlib import Path

import inproc
import jsonschema
import pytest

from hwprofile.pipeline import make_plan
from hwprofile.plan import PlanRefused

SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "schemas" / "hwprofile.plan-1.schema.json").read_text()
)
HOSTS = sorted(p.stem for p in (Path(__file__).resolve().parent / "fixtures" / "hosts").glob("*.yaml"))


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("name", HOSTS)
def test_real_plans_validate(name, host_of, empty_root) -> None:
    host = host_of(name)
    checked = 0
    for model, sets in [
        (None, []),
        ("Qwen/Qwen3-0.6B", []),
        ("Qwen/Qwen3-8B", ["speculative.method=ngram"]),
        ("Qwen/Qwen3-30B-A3B", ["speculative.method=none"]),
        ("Qwen/Qwen3-8B", ["engine.attention_backend=TRITON_ATTN"]),  # the rendered backend
    ]:
        try:
            plan = make_plan(host, empty_root, model=model, sets=sets, environ={}).to_json()
        except PlanRefused:
            continue
        jsonschema.validate(json.loads(json.dumps(plan)), SCHEMA)
        checked += 1
    assert checked >= 1


def test_a_broken_plan_does_not_validate(host_of, empty_root) -> None:
    plan = json.loads(json.dumps(make_plan(host_of("rtx4090-1x"), empty_root, environ={}).to_json()))
    plan["instances"][0]["engine"]["max_num_seqs"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(plan, SCHEMA)
    plan = json.loads(json.dumps(make_plan(host_of("rtx4090-1x"), empty_root, environ={}).to_json()))
    plan["instances"][0]["surprise"] = 1  # a new key must be added to the contract first
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(plan, SCHEMA)


def test_cli_json_and_refusal_validate(tmp_path, fake_nvml_dir, empty_root) -> None:
    from fakehost import build

    host = build("no-driver", tmp_path / "h")
    env = {**host.env(fake_nvml_dir), "HWPROFILE_CONFIG_ROOT": str(empty_root)}
    ok = inproc.hwprofile(["plan", "--json", "--model", "Qwen/Qwen3-0.6B"], env)
    assert ok.returncode == 0, ok.stderr
    jsonschema.validate(json.loads(ok.stdout), SCHEMA)
    refused = inproc.hwprofile(["plan", "--json", "--model", "Qwen/Qwen2.5-72B-Instruct"], env)
    assert refused.returncode == 1
    jsonschema.validate(json.loads(refused.stdout), SCHEMA)
