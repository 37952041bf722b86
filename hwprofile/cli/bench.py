"""``hwprofile bench``: vLLM's own ``vllm bench serve`` against a running server (``--url``) or the
plan of the command's options, launched here (one server at a time); ``--compare A B`` runs two
plans alternately for ``bench.rounds`` rounds. Results as JSON (schema ``hwprofile.bench/1``) and a
PNG under ``--output DIR``; the report's first line says whether a GPU throttled."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, HwprofileError
from .common import CliError, demo_model, launch_of, load_host, plan_of

# `--demo`: besides the demo plan (cli.common.DEMO_SETS), a workload the tiny model answers in about
# a minute on two cores, most of it vLLM starting: one point of 8 short requests, 4 at a time (the demo
# plan's max_num_seqs); later --set options win
DEMO_BENCH_SETS = (
    "bench.input_len=64", "bench.output_len=32", "bench.num_prompts=8", "bench.concurrency=4", "bench.sweep_max=4",
)  # fmt: skip
POINT_TIMEOUT_S = 7200.0


def _progress(msg: str) -> None:
    print(f"hwprofile: bench: {msg}", file=sys.stderr, flush=True)


def _side(
    word: str, sets: list[str], overrides: list[str]
) -> tuple[str, str, str | None, list[str], list[str]]:
    """One ``--compare`` operand: (label, kind, source, sets, overrides)."""
    if word == "profile":
        return "profile", "profile", None, sets, overrides
    if word == "baseline":
        return "baseline", "baseline", None, [*sets, "speculative.method=none"], overrides
    if os.path.isfile(word):
        return Path(word).stem, "overrides", os.path.abspath(word), sets, [*overrides, os.path.abspath(word)]
    raise CliError(
        f"--compare {word}: neither 'profile', 'baseline' nor an overrides file (no such file)", EXIT_USAGE
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.campaign import finish, run_campaign
    from ..bench.result import BenchPlan
    from ..bench.runner import BenchFailed, Point, Target, discover, run_point
    from ..bench.tags import HardwareSampler, host_tags, non_default_settings
    from ..bench.workloads import Workload, bench_settings, workload
    from ..config.layers import config_root
    from ..pipeline import resolve_settings, vllm_command

    if args.url and args.compare:
        raise CliError("--compare launches both plans itself: give it without --url", EXIT_USAGE)
    host = load_host(args)
    root = config_root(args.config_root)
    model, sets = args.model, list(args.sets)
    if args.demo:
        _progress("demo: a short workload (--set bench.* to change)")
        model, sets = demo_model(sets, DEMO_BENCH_SETS)
    resolved: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = {}

    def settings_of(s_over: list[str], s_sets: list[str]) -> Any:  # each side's settings, resolved once
        key = (tuple(s_over), tuple(s_sets))
        if key not in resolved:
            resolved[key] = resolve_settings(host, root, args.profile, s_over, s_sets)
        return resolved[key]

    res = settings_of(list(args.overrides), sets)
    bs = bench_settings(res.settings)
    wl = workload(args.workload, bs)
    rounds = args.rounds or (bs.rounds if args.compare else 1)

    plans: list[BenchPlan] = []
    launches: dict[str, Any] = {}  # label -> the plan's launch (refused here, before anything runs)
    if args.url:
        plans.append(BenchPlan("server", "url", args.url, None, url=args.url))
    else:
        sides = [_side(w, sets, list(args.overrides)) for w in args.compare] if args.compare else [
            ("profile", "profile", None, sets, list(args.overrides))
        ]  # fmt: skip
        if len(sides) == 2 and sides[0][0] == sides[1][0]:
            sides = [(f"{s[0]}-{i}", *s[1:]) for i, s in enumerate(sides, start=1)]
        for label, kind, source, s_sets, s_over in sides:
            over_args = argparse.Namespace(**{**vars(args), "overrides": s_over})
            plan, inputs = plan_of(over_args, host, model=model, sets=s_sets)
            launches[label] = launch_of(args, host, plan, inputs, Path(), _progress)
            r = settings_of(s_over, s_sets)
            plans.append(BenchPlan(label, kind, source, plan.profile, plan=plan,
                                   non_default_settings=non_default_settings(r.settings, r.provenance)))  # fmt: skip

    if args.output:
        out_dir = Path(args.output)
    else:  # never the working directory (a clone would gain an untracked folder): the state directory
        from ..runtime.dirs import state_dir

        out_dir = state_dir() / "bench" / f"hwprofile-bench-{_stamp()}"
    made = not out_dir.exists()  # ours to take away again if nothing ran
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"--output {out_dir}: cannot create it: {e.strerror}", EXIT_FAILED) from None
    _progress(f"results go to {out_dir}")
    _quiet_vllm()
    configured_vllm = res.settings.server.vllm_command

    @contextlib.contextmanager
    def serve(bp: BenchPlan) -> Iterator[Any]:
        if bp.url:
            yield discover(bp.url, vllm_command(configured_vllm))
            return
        import shutil
        import tempfile

        from ..launch.start import serving
        from ..runtime.dirs import runtime_dir

        inst = bp.plan.instances[0]
        ep = bp.plan.endpoint
        front = ep is not None and ep.via in ("nginx", "router")  # separate servers: through their one URL
        if front:
            who = "vLLM's router" if ep.via == "router" else "nginx"
            _progress(f"{bp.label}: {len(bp.plan.instances)} servers; vllm bench serve measures their one URL "
                      f"{ep.url} ({who} in front, as clients reach them)")  # fmt: skip
        elif len(bp.plan.instances) > 1:
            _progress(
                f"{bp.label}: {len(bp.plan.instances)} instances planned; vllm bench serve measures {inst.name}"
            )
        own = args.runtime_dir is None  # a private runtime dir: never the one of a running `hwprofile launch`
        runtime = Path(tempfile.mkdtemp(prefix="hwpb-")) if own else runtime_dir(args.runtime_dir)
        vllm = vllm_command(inst.server.vllm_command)
        logs: list[tuple[str, Path]] = []
        try:
            with serving(dataclasses.replace(launches[bp.label], runtime=runtime)) as sup:
                logs[:] = [(i.name, Path(i.log.path)) for i in sup.instances]
                served = inst.server.served_model_name or bp.plan.model.path or bp.plan.model.name
                tokenizer = bp.plan.model.path or bp.plan.model.name
                if front and ep.via == "router":  # the supervisor runs it (serving waited for it)
                    yield Target(ep.url, served, tokenizer, vllm)
                elif front:
                    from ..supervise.front import nginx_front

                    with nginx_front(bp.plan, runtime / "nginx") as url:
                        yield Target(url, served, tokenizer, vllm)
                else:
                    yield Target(sup.instances[0].url, served, tokenizer, vllm)
        finally:
            _keep_logs(logs, out_dir, bp.label)
            if own:
                shutil.rmtree(runtime, ignore_errors=True)

    def gpus_of(bp: BenchPlan | None) -> dict[int, str | None]:
        names = {g.index: g.name for g in host.gpus if not g.lost}
        used = (
            {i for inst in bp.plan.instances for i in inst.gpus}
            if bp is not None and bp.plan is not None
            else set()
        )
        return {i: n for i, n in names.items() if not used or i in used}

    current: list[BenchPlan] = []

    def sampler() -> HardwareSampler:
        return HardwareSampler(gpus_of(current[0] if current else None))

    def point(target: Target, wl_: Workload, c: int, d: Path, tag: str) -> Point:
        return run_point(target, wl_, c, d, tag, timeout_s=POINT_TIMEOUT_S)

    def serve_tracked(bp: BenchPlan) -> contextlib.AbstractContextManager[Target]:
        current[:] = [bp]
        return serve(bp)

    htags = host_tags(host)
    command = ["hwprofile", *(args.argv if args.argv is not None else sys.argv[1:])]
    error: HwprofileError | None = None
    try:
        run_campaign(plans, wl, rounds, out_dir, serve_tracked, point, sampler, _progress)
    except (HwprofileError, BenchFailed) as e:
        error = e
    ran = any(p.runs for p in plans)
    if error is not None and not ran:
        if made:
            _remove_empty(out_dir)
        raise error
    doc, report = finish(
        plans, wl, htags, out_dir, command, make_plot=not args.no_plot,
        error="; ".join(error.messages()) if error else None,
    )  # fmt: skip
    if args.json:
        import json

        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(report)
    if getattr(args, "calibrate", False) and error is None and doc["plans"]:
        _progress(f"calibration of this host: {store_calibration(doc, root, host)}")
    if error is not None:
        for line in error.messages():
            print(f"hwprofile: error: {line}", file=sys.stderr)
        return error.exit_code
    return EXIT_OK if doc["plans"] else EXIT_FAILED


def store_calibration(doc: dict[str, Any], root: Any, host: Any) -> str:
    """``doc`` (a bench result) as this host's calibration, ``<root>/calibration/<fingerprint>.json``,
    after the same checks a plan makes when it reads it (an unusable result is refused, nothing stored);
    the next plan's predictions are "calibrated" from it. Returns the path."""
    import json

    from ..pipeline import calibration_from_bench, calibration_path
    from ..runtime.files import atomic_write

    text = json.dumps(doc, indent=2, default=str) + "\n"
    path = calibration_path(root, host)
    calibration_from_bench(json.loads(text), path, host)  # ConfigError: not a usable measurement
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return path


def _quiet_vllm() -> None:
    """hwprofile's own warnings on stderr, vLLM's lines not: they are in its log files, kept beside the
    results (without a handler, Python's last resort printed every vLLM WARNING/ERROR line here)."""
    import logging

    log = logging.getLogger("hwprofile")
    if log.handlers:  # set up by a caller (a test, the daemon): theirs
        return
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.addFilter(lambda record: not record.name.startswith("hwprofile.vllm"))
    console.setFormatter(logging.Formatter("hwprofile: bench: %(message)s"))
    log.addHandler(console)


def _keep_logs(logs: list[tuple[str, Path]], out_dir: Path, label: str) -> None:
    """Append each served instance's vLLM log to ``<out_dir>/<label>-<instance>.vllm.log`` (the runtime
    directory that held it is taken away), and say where, once per file."""
    for name, path in logs:
        dest = out_dir / f"{label}-{name}.vllm.log"
        first = not dest.exists()
        try:
            with path.open("rb") as src, dest.open("ab") as out:
                shutil.copyfileobj(src, out)
        except OSError as e:
            _progress(f"{name}: vLLM's log {path} not kept: {e.strerror}")
            continue
        if first:
            _progress(f"{label}: vLLM's own output (warnings included) is in {dest}")


def _remove_empty(top: Path) -> None:
    """Take away the directories a failed bench made, if they hold no file: a refusal leaves nothing."""
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def _stamp() -> str:
    import time

    return time.strftime("%Y%m%d-%H%M%S")
