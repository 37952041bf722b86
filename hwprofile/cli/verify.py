"""``hwprofile verify``: does the tuned plan answer as the baseline does? Greedy answers to the
reference prompts from a baseline (the same plan with speculative decoding off: same model, same
dtype) and from the tuned plan, compared token by token. Exit 0 pass, 1 fail (below the bar, or a
server that did not answer), 2 bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_FAILED, EXIT_OK
from .common import CliError, demo_model, launch_of, load_host, plan_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..config.settings import Settings
    from ..host.snapshot import HostSnapshot
    from ..plan.types import Plan
    from ..verify.compare import Verdict
    from ..verify.prompts import Prompt

BASELINE_SET = "speculative.method=none"


def verify_settings(settings: Settings) -> tuple[float, int]:
    """``(verify.min_similarity, verify.max_tokens)`` of the resolved settings."""
    return settings.verify.min_similarity, settings.verify.max_tokens


def _say(msg: str) -> None:
    print(f"hwprofile: verify: {msg}", file=sys.stderr)


def _served_name(plan: Plan) -> str:
    names = plan.instances[0].server.served_model_name
    return names.split()[0] if names else (plan.model.path or plan.model.name)


def _plan_side(plan: Plan) -> dict[str, Any]:
    inst = plan.instances[0]
    spec = inst.speculative
    return {
        "profile": plan.profile,
        "instance": inst.name,
        "dtype": inst.engine.dtype,
        "speculative": None
        if spec is None
        else {
            "method": spec.method,
            "model": spec.model,
            "num_speculative_tokens": spec.num_speculative_tokens,
        },
    }


def cmd_verify(args: argparse.Namespace) -> int:
    from ..config.layers import config_root
    from ..pipeline import resolve_settings
    from ..verify.prompts import load_prompts

    if bool(args.baseline_url) != bool(args.url):
        raise CliError(
            "--baseline-url and --url go together: both servers, or neither (hwprofile serves both)"
        )
    if args.demo and args.url:
        raise CliError("--demo serves the tiny model itself: leave out --baseline-url and --url")
    prompts = load_prompts(args.prompts)
    if args.limit is not None:
        prompts = prompts._replace(prompts=prompts.prompts[: args.limit])
    host = load_host(args)
    model, sets = args.model, list(args.sets)
    if args.demo:
        model, sets = demo_model(sets)
    res = resolve_settings(host, config_root(args.config_root), args.profile, args.overrides, sets)
    bar, max_tokens = verify_settings(res.settings)
    max_tokens = args.max_tokens or max_tokens
    request = {"endpoint": "/v1/completions", "max_tokens": max_tokens, "temperature": 0}
    if args.url:
        verdict, base, cand, notes = _compare_urls(
            args.baseline_url, args.url, prompts.prompts, max_tokens, bar
        )
    else:
        verdict, base, cand, notes = _serve_both(args, host, model, sets, prompts.prompts, max_tokens, bar)
    from ..verify.report import format_text, to_json
    from ..verify.runner import SEED, TOP_LOGPROBS

    if args.demo:
        notes.append(
            "demo: the tiny model's weights are random (made offline), so its answers are gibberish by design; "
            "what counts is that the tuned plan gives the same tokens. On a GPU host: hwprofile verify --model NAME"
        )
    settings = {
        **request,
        "seed": SEED,
        "concurrency": 1,
        "baseline_top_logprobs": TOP_LOGPROBS,
        "prompts_file": prompts.source,
    }
    doc = to_json(verdict, base, cand, settings, notes)
    if args.json:
        import json

        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_text(doc))
    return EXIT_OK if verdict.passed else EXIT_FAILED


def _compare_urls(
    baseline_url: str, url: str, prompts: Sequence[Prompt], max_tokens: int, bar: float
) -> tuple[Verdict, dict[str, Any], dict[str, Any], list[str]]:
    """Two servers already running: the baseline's answers, then the candidate's, compared."""
    from ..verify.compare import compare
    from ..verify.runner import TOP_LOGPROBS, Client, served_model

    base = Client(baseline_url, served_model(baseline_url), max_tokens, logprobs=TOP_LOGPROBS)
    cand = Client(url, served_model(url), max_tokens)
    notes: list[str] = []
    if base.model != cand.model:
        notes.append(f"the servers name different models: baseline {base.model!r}, candidate {cand.model!r}")
    b, b_s = base.answers(prompts, _say, "baseline")
    c, c_s = cand.answers(prompts, _say, "candidate")
    verdict = compare(prompts, b, c, bar, base.decode)
    notes += base.notes + cand.notes
    return (
        verdict,
        {"source": "url", "url": base.url, "model": base.model, "seconds": b_s, "plan": None},
        {"source": "url", "url": cand.url, "model": cand.model, "seconds": c_s, "plan": None},
        notes,
    )


def _serve_both(
    args: argparse.Namespace,
    host: HostSnapshot,
    model: str | None,
    sets: list[str],
    prompts: Sequence[Prompt],
    max_tokens: int,
    bar: float,
) -> tuple[Verdict, dict[str, Any], dict[str, Any], list[str]]:
    """Serve the baseline plan, ask it, stop it; then the same for the tuned plan (never both at
    once), and compare while the tuned plan still serves (its ``/detokenize`` names the tokens)."""
    from ..launch.start import serving, setup_logging
    from ..runtime.dirs import runtime_dir
    from ..verify.compare import compare
    from ..verify.runner import TOP_LOGPROBS, Client

    tuned, tuned_inputs = plan_of(args, host, model=model, sets=sets)
    baseline, base_inputs = plan_of(args, host, model=model, sets=[*sets, BASELINE_SET])
    notes: list[str] = []
    if tuned.instances[0].speculative is None:
        notes.append("the tuned plan does not speculate: it is compared with a baseline of the same settings")
    if len(tuned.instances) > 1:
        notes.append(
            f"the tuned plan has {len(tuned.instances)} instances; the first ({tuned.instances[0].name}) is verified"
        )
    if tuned.instances[0].engine.dtype != baseline.instances[0].engine.dtype:  # not from the same settings
        notes.append(
            f"dtype differs: baseline {baseline.instances[0].engine.dtype}, tuned {tuned.instances[0].engine.dtype}"
        )
    runtime = Path(args.runtime_dir) if args.runtime_dir else runtime_dir(None) / "verify"
    first = launch_of(args, host, baseline, base_inputs, runtime, _say)
    second = launch_of(args, host, tuned, tuned_inputs, runtime, _say)
    setup_logging(runtime, to_stderr=True)
    _say(f"serving the baseline ({_served_name(baseline)}, speculative decoding off) ...")
    with serving(first) as sup:
        base = Client(sup.instances[0].url, _served_name(baseline), max_tokens, logprobs=TOP_LOGPROBS)
        b, b_s = base.answers(prompts, _say, "baseline")
    spec = tuned.instances[0].speculative
    _say(f"serving the tuned plan (speculative {spec.method if spec else 'off'}) ...")
    with serving(second) as sup:
        cand = Client(sup.instances[0].url, _served_name(tuned), max_tokens)
        c, c_s = cand.answers(prompts, _say, "tuned")
        verdict = compare(prompts, b, c, bar, cand.decode)
    notes += base.notes + cand.notes
    return (
        verdict,
        {
            "source": "served",
            "url": base.url,
            "model": base.model,
            "seconds": b_s,
            "plan": _plan_side(baseline),
        },
        {"source": "served", "url": cand.url, "model": cand.model, "seconds": c_s, "plan": _plan_side(tuned)},
        notes,
    )
