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
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, HwprofileError
from .common import CliError, demo_model, launch_of, load_host, plan_of

if TYPE_CHECKING:
    from ..bench.result import BenchPlan
    from ..bench.runner import Point, Target
    from ..bench.tags import HardwareSampler
    from ..bench.workloads import Workload
    from ..host.snapshot import HostSnapshot
    from ..launch.start import Launch
    from ..pipeline import PlanInputs, Resolution
    from ..plan.types import Plan

# `--demo`: besides the demo plan (cli.common.DEMO_SETS), a workload the tiny model answers in about
# a minute on two cores, most of it vLLM starting: one point of 8 short requests, 4 at a time (the demo
# plan's max_num_seqs); later --set options win
DEMO_BENCH_SETS = (
    "bench.input_len=64",
    "bench.output_len=32",
    "bench.num_prompts=8",
    "bench.concurrency=4",
    "bench.sweep_max=4",
)
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


def speculates(plans: list[BenchPlan]) -> bool | None:
    """Whether any side of the benchmark speculates: from its plan, or for a server at --url from
    its metrics (spec-decode counters present); None when a server's metrics cannot be read."""
    from ..bench.runner import spec_counters

    seen: list[bool | None] = []
    for bp in plans:
        if bp.plan is not None:
            seen.append(any(i.speculative is not None for i in bp.plan.instances))
        elif bp.url:
            counters, error = spec_counters(bp.url)
            seen.append(None if error else counters is not None)
    if any(seen):
        return True
    return None if None in seen else False


def _refuse_with_url(args: argparse.Namespace) -> None:
    """What a bench of a server at ``--url`` (not launched here) cannot do: a usage error saying why."""
    if args.url and args.compare:
        raise CliError("--compare launches both plans itself: give it without --url", EXIT_USAGE)
    if args.url and getattr(args, "calibrate", False):
        raise CliError(
            "--calibrate stores a bench of a plan hwprofile launched (its model, batching and speculation "
            "known: a calibration is set against them); the server at --url runs what hwprofile cannot "
            "see: bench with --model MODEL --calibrate instead",
            EXIT_USAGE,
        )


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.campaign import run_campaign
    from ..bench.runner import BenchFailed
    from ..bench.tags import host_tags
    from ..bench.workloads import bench_settings, prompts_path, resolve_dataset, workload
    from ..config.layers import config_root

    _refuse_with_url(args)
    host = load_host(args)
    model, sets = args.model, list(args.sets)
    if args.demo:
        _progress("demo: a short workload (--set bench.* to change)")
        model, sets = demo_model(sets, DEMO_BENCH_SETS)
    settings_of = _SettingsOf(host, config_root(args.config_root), args.profile)
    res = settings_of(list(args.overrides), sets)
    bs = bench_settings(res.settings)
    wl = workload(args.workload, bs)
    rounds = args.rounds or (bs.rounds if args.compare else 1)
    plans, launches = _bench_plans(args, host, model, sets, settings_of, wl)

    wl = resolve_dataset(wl, speculates(plans))
    _progress(
        f"prompts: {'real prompts (' + prompts_path() + ')' if wl.dataset == 'prompts' else 'random tokens'}"
        f" ({wl.dataset_why})"
    )

    out_dir, made = _output_dir(args)
    _progress(f"results go to {out_dir}")
    _quiet_vllm()
    servers = _Servers(args, host, launches, out_dir, res.settings.server.vllm_command)
    htags = host_tags(host)
    command = ["hwprofile", *(args.argv if args.argv is not None else sys.argv[1:])]
    error: HwprofileError | None = None
    try:
        run_campaign(
            plans,
            wl,
            rounds,
            out_dir,
            servers.serve_tracked,
            servers.point,
            servers.sampler,
            _progress,
            repeats=getattr(args, "repeats", 1) or 1,
        )
    except (HwprofileError, BenchFailed) as e:
        error = e
    ran = any(p.runs for p in plans)
    if error is not None and not ran:
        if made:
            _remove_empty(out_dir)
        raise error
    code, doc = _report(args, plans, wl, htags, out_dir, command, error)
    if getattr(args, "calibrate", False) and error is None and doc["plans"]:
        _calibrate(doc, settings_of.root, host)
    return code


def _calibrate(doc: dict[str, Any], root: str, host: HostSnapshot) -> None:
    """``bench --calibrate``: the bench stored as this host's calibration, with its caveats."""
    from ..bench.accuracy import calibration_caveats

    _progress(f"calibration of this host: {store_calibration(doc, root, host)}")
    for caveat in calibration_caveats(doc["plans"][0]["summary"]):
        _progress(f"calibration: {caveat}")


class _SettingsOf:
    """Each side's settings (its overrides files and ``--set`` options), resolved once."""

    def __init__(self, host: HostSnapshot, root: str, profile: str | None) -> None:
        self.host, self.root, self.profile = host, root, profile
        self.resolved: dict[tuple[tuple[str, ...], tuple[str, ...]], Resolution] = {}

    def __call__(self, s_over: list[str], s_sets: list[str]) -> Resolution:
        from ..pipeline import resolve_settings

        key = (tuple(s_over), tuple(s_sets))
        if key not in self.resolved:
            self.resolved[key] = resolve_settings(self.host, self.root, self.profile, s_over, s_sets)
        return self.resolved[key]


def _bench_plans(
    args: argparse.Namespace,
    host: HostSnapshot,
    model: str | None,
    sets: list[str],
    settings_of: _SettingsOf,
    wl: Workload,
) -> tuple[list[BenchPlan], dict[str, Launch]]:
    """What is measured: the server at ``--url``, or each side's plan with its launch (a launch
    refused here, before anything runs), labelled apart where both sides have one name."""
    from ..bench.result import BenchPlan
    from ..bench.tags import non_default_settings

    plans: list[BenchPlan] = []
    launches: dict[str, Launch] = {}  # label -> the plan's launch (refused here, before anything runs)
    if args.url:
        why = (
            "a server at --url: no plan of hwprofile's to predict it (bench the plan itself, without --url, "
            "for the accuracy gate)"
        )
        plans.append(BenchPlan("server", "url", args.url, None, url=args.url, predictions_why=why))
        return plans, launches
    sides = (
        [_side(w, sets, list(args.overrides)) for w in args.compare]
        if args.compare
        else [("profile", "profile", None, sets, list(args.overrides))]
    )
    if len(sides) == 2 and sides[0][0] == sides[1][0]:
        sides = [(f"{s[0]}-{i}", *s[1:]) for i, s in enumerate(sides, start=1)]
    for label, kind, source, s_sets, s_over in sides:
        over_args = argparse.Namespace(**{**vars(args), "overrides": s_over})
        plan, inputs = plan_of(over_args, host, model=model, sets=s_sets)
        launches[label] = launch_of(args, host, plan, inputs, Path(), _progress)
        r = settings_of(s_over, s_sets)
        preds, why = predictions_of(inputs, launches[label].plan, wl)
        plans.append(
            BenchPlan(
                label,
                kind,
                source,
                plan.profile,
                plan=plan,
                non_default_settings=non_default_settings(r.settings, r.provenance),
                predictions=preds,
                predictions_why=why,
            )
        )
    return plans, launches


def predictions_of(
    inputs: PlanInputs, plan: Plan, wl: Workload
) -> tuple[dict[int, dict[str, Any] | None], str]:
    """What the plan that runs predicts at each of the workload's concurrencies (before anything runs,
    so before ``--calibrate`` stores this bench), and why a figure is missing where one is."""
    from ..pipeline import predictions_at

    inst = plan.instances[0] if plan.instances else None
    ep = plan.endpoint
    front = ep is not None and ep.via in ("nginx", "router")
    if inst is None:
        return {}, "the plan has no instance"
    try:
        got = predictions_at(inputs, plan, wl.input_len, wl.output_len, wl.concurrencies, front)
    except HwprofileError as e:
        return {}, f"the plan could not be predicted at the workload: {'; '.join(e.messages())}"
    preds = {c: (p.to_json() if p is not None else None) for c, p in got.items()}
    if inst.device == "cpu":
        why = "a CPU has no datasheet here: nothing is predicted until this host is calibrated"
    else:
        why = f"no datasheet figures for {inst.gpu_name or 'these GPUs'} (hwprofile/data/gpus.yaml)"
    return preds, why


def _output_dir(args: argparse.Namespace) -> tuple[Path, bool]:
    """The results' directory, created, and whether it was made here (ours to take away again if
    nothing ran)."""
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
    return out_dir, made


def _report(
    args: argparse.Namespace,
    plans: list[BenchPlan],
    wl: Workload,
    htags: dict[str, Any],
    out_dir: Path,
    command: list[str],
    error: HwprofileError | None,
) -> tuple[int, dict[str, Any]]:
    """Write bench.json and the plot, print the report (or the JSON), say the error; the exit code
    and the result document."""
    from ..bench.campaign import finish

    doc, report = finish(
        plans,
        wl,
        htags,
        out_dir,
        command,
        make_plot=not args.no_plot,
        error="; ".join(error.messages()) if error else None,
    )
    if args.json:
        import json

        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(report)
    if error is not None:
        for line in error.messages():
            print(f"hwprofile: error: {line}", file=sys.stderr)
        return error.exit_code, doc
    return (EXIT_OK if doc["plans"] else EXIT_FAILED), doc


def store_calibration(doc: dict[str, Any], root: str | os.PathLike[str], host: HostSnapshot) -> str:
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


class _Servers:
    """The servers a campaign measures, one at a time: the one at ``--url``, or each plan's, launched
    here; and what the campaign samples and runs against the one being served."""

    def __init__(
        self,
        args: argparse.Namespace,
        host: HostSnapshot,
        launches: dict[str, Launch],
        out_dir: Path,
        configured_vllm: str | None,
    ) -> None:
        self.args, self.host, self.launches, self.out_dir = args, host, launches, out_dir
        self.configured_vllm = configured_vllm
        self.current: list[BenchPlan] = []

    def gpus_of(self, bp: BenchPlan | None) -> dict[int, str | None]:
        names = {g.index: g.name for g in self.host.gpus if not g.lost}
        used = (
            {i for inst in bp.plan.instances for i in inst.gpus}
            if bp is not None and bp.plan is not None
            else set()
        )
        return {i: n for i, n in names.items() if not used or i in used}

    def sampler(self) -> HardwareSampler:
        from ..bench.tags import HardwareSampler

        return HardwareSampler(self.gpus_of(self.current[0] if self.current else None))

    def point(self, target: Target, wl_: Workload, c: int, d: Path, tag: str) -> Point:
        from ..bench.runner import run_point

        return run_point(target, wl_, c, d, tag, timeout_s=POINT_TIMEOUT_S)

    def serve_tracked(self, bp: BenchPlan) -> contextlib.AbstractContextManager[Target]:
        self.current[:] = [bp]
        return self.serve(bp)

    @contextlib.contextmanager
    def serve(self, bp: BenchPlan) -> Iterator[Any]:
        from ..bench.runner import Target, discover
        from ..pipeline import vllm_command

        if bp.url:
            yield discover(bp.url, vllm_command(self.configured_vllm))
            return
        import shutil
        import tempfile

        from ..launch.start import serving
        from ..runtime.dirs import runtime_dir

        plan = bp.plan
        if plan is None:
            raise ValueError(f"{bp.label}: neither a URL nor a plan to serve")
        inst = plan.instances[0]
        ep = plan.endpoint
        front = ep is not None and ep.via in ("nginx", "router")  # separate servers: through their one URL
        router = ep.url if ep is not None and ep.via == "router" else None
        _say_what_is_measured(bp.label, plan, front)
        # a private runtime dir: never the one of a running `hwprofile launch`
        own = self.args.runtime_dir is None
        runtime = Path(tempfile.mkdtemp(prefix="hwpb-")) if own else runtime_dir(self.args.runtime_dir)
        vllm = vllm_command(inst.server.vllm_command)
        logs: list[tuple[str, Path]] = []
        try:
            with serving(dataclasses.replace(self.launches[bp.label], runtime=runtime)) as sup:
                logs[:] = [(i.name, Path(i.log.path)) for i in sup.instances]
                served = inst.server.served_model_name or plan.model.path or plan.model.name
                tokenizer = plan.model.path or plan.model.name
                if router is not None:  # the supervisor runs it (serving waited for it)
                    yield Target(router, served, tokenizer, vllm)
                elif front:
                    from ..supervise.front import nginx_front

                    with nginx_front(plan, runtime / "nginx") as url:
                        yield Target(url, served, tokenizer, vllm)
                else:
                    yield Target(sup.instances[0].url, served, tokenizer, vllm)
        finally:
            _keep_logs(logs, self.out_dir, bp.label)
            if own:
                shutil.rmtree(runtime, ignore_errors=True)


def _say_what_is_measured(label: str, plan: Plan, front: bool) -> None:
    """Where a plan of several servers is measured: their one URL, or its first instance."""
    inst = plan.instances[0]
    ep = plan.endpoint
    if front and ep is not None:
        who = "vLLM's router" if ep.via == "router" else "nginx"
        _progress(
            f"{label}: {len(plan.instances)} servers; vllm bench serve measures their one URL "
            f"{ep.url} ({who} in front, as clients reach them)"
        )
    elif len(plan.instances) > 1:
        _progress(f"{label}: {len(plan.instances)} instances planned; vllm bench serve measures {inst.name}")


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
