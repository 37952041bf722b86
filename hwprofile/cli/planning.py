"""``hwprofile plan`` and ``render``: the launch plan, and the plan for the vLLM release that will run it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import EXIT_FAILED, EXIT_OK
from .common import CliError, load_host, plan_of, render_release

if TYPE_CHECKING:
    from ..plan.types import Plan
    from ..render.k8s import Target
    from ..render.translate import Rendered
    from ..render.versions import Release


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from ..plan import SCHEMA, PlanRefused

    host = load_host(args)
    try:
        plan, inputs = plan_of(args, host)
    except PlanRefused as e:
        if not args.json:
            raise  # printed as every command prints a refused plan
        refused: dict[str, object] = {"reason": e.message, "suggestions": e.suggestions}
        if e.memory is not None:
            refused["memory"] = e.memory
        out = {"schema": SCHEMA, "refused": refused}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return EXIT_FAILED
    if args.advice_from:
        from .advice import AdviceError, advice_from

        try:
            advice, extra = advice_from(args.advice_from, plan, plan.watch)
        except AdviceError as e:
            raise CliError(str(e), EXIT_FAILED) from None
        print(f"hwprofile: advice from {args.advice_from}: {advice.reason}", file=sys.stderr)
        print(f"hwprofile: applied as --set {' --set '.join(extra)}", file=sys.stderr)
        plan = inputs.replan(extra)
    if args.json:
        sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
    else:
        from .views import format_plan

        sys.stdout.write(format_plan(plan, explain=args.explain, roots=_roots(args)))
    return EXIT_OK


def _roots(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The roots the human view shows paths relative to, each with what it is."""
    import os

    from ..config.layers import config_root
    from ..match.profiles import builtin_dir

    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return [
        ("profiles/", builtin_dir(), "the built-in profiles"),
        ("hwprofile/", package, "the installed hwprofile package"),
        (
            "<config root>/",
            config_root(getattr(args, "config_root", None)),
            "the site configuration: --config-root, else $HWPROFILE_CONFIG_ROOT, else /etc/hwprofile",
        ),
    ]


def cmd_render(args: argparse.Namespace) -> int:
    from ..pipeline import vllm_command
    from ..render.output import UnsafeValue, render
    from ..render.translate import render_instance

    if args.format == "k8s":
        return _render_k8s(args)
    if args.nodes:
        raise CliError("--nodes is for --format k8s")
    host = load_host(args)
    rel = render_release(
        args, host, "no vLLM is installed here to render for: pass --vllm-version X.Y.Z (e.g. 0.11.0)"
    )
    version = rel.target
    plan, _ = plan_of(args, host)
    if args.format == "nginx":  # one file for the whole plan, not one per instance
        return _render_nginx(args, plan)
    instances = [i for i in plan.instances if args.instance in (None, i.name)]
    if not instances:
        names = ", ".join(i.name for i in plan.instances)
        raise CliError(f"--instance {args.instance}: no such instance; this plan has: {names}")
    status = EXIT_OK
    for inst in instances:
        r = render_instance(
            plan, inst, rel, vllm_command(inst.server.vllm_command), host.software.numactl_path
        )
        secrets = _secret_values(args, r.secrets)
        try:
            text = render(r, args.format, plan, inst, env_file=args.env_file, secret_values=secrets)
        except UnsafeValue as e:
            raise CliError(f"cannot render --format {args.format}: {e}") from None
        if args.output:
            _write_output(args.output, r.name, args.format, text)
        else:
            if len(instances) > 1 and args.format in ("yaml", "env", "systemd"):
                sys.stdout.write(f"# --- {r.name}\n")
            sys.stdout.write(text)
        for w in r.warnings:
            print(f"hwprofile: warning: {r.name}: {w}", file=sys.stderr)
        if args.check and not _check_rendered(r, plan, version):
            status = EXIT_FAILED
    return status


def _render_nginx(args: argparse.Namespace, plan: Plan) -> int:
    """``render --format nginx``: one file for the whole plan, not one per instance."""
    from ..render.output import UnsafeValue, render_nginx

    try:
        text = render_nginx(plan)
    except UnsafeValue as e:
        raise CliError(f"cannot render --format nginx: {e}") from None
    if args.output:
        _write_output(args.output, "hwprofile", "nginx", text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _secret_values(args: argparse.Namespace, wanted: dict[str, str]) -> dict[str, str]:
    """The secrets an environment file written to ``--output`` holds (target -> the value of the
    environment variable it names); none for any other output."""
    import os

    secrets = {}
    if args.output and args.format == "env":
        for target, source in wanted.items():
            if source not in os.environ:
                raise CliError(
                    f"server.api_key_env names ${source}, which is not set: export it, then render again"
                )
            secrets[target] = os.environ[source]
    return secrets


def _check_rendered(r: Rendered, plan: Plan, version: str) -> bool:
    """``render --check``: whether vLLM's parser and engine config accept the rendered arguments,
    said on stderr."""
    from ..render.check import check_args
    from ..render.translate import flatten

    model = plan.model.path or plan.model.name
    res = check_args(flatten(r.args), model, version, r.env)
    where = f"vLLM {res.vllm_version or version}"
    if res.ok:
        print(
            f"hwprofile: check: {r.name}: accepted by {where}'s parser and engine config"
            + (" (cached)" if res.cached else ""),
            file=sys.stderr,
        )
        return True
    print(
        f"hwprofile: check: {r.name}: rejected by {where} ({res.stage}): {res.message}",
        file=sys.stderr,
    )
    return False


def _render_k8s(args: argparse.Namespace) -> int:
    """``render --format k8s``: the manifests of the one GPU class of the snapshot (``--from``, or
    this host), or of every GPU class of a cluster's nodes (``--nodes FILE``)."""
    from ..render.k8s import Options, render_k8s, snapshot_target

    if args.check or args.instance:
        raise CliError(
            "--format k8s renders every instance and has no --check (render --format argv "
            "--check checks the same arguments)"
        )
    header: list[str] = []
    if args.nodes:
        if args.from_file or args.inventory:
            raise CliError("--nodes and --from/--inventory name the hosts two ways: give one")
        rel, targets, header, notes = _node_targets(args)
    else:
        host = load_host(args)
        rel = render_release(
            args, host, "no vLLM is installed here to render for: pass --vllm-version X.Y.Z (e.g. 0.11.0)"
        )
        _, inputs = plan_of(args, host)
        targets = [snapshot_target(inputs)]
        notes = []
    text, warnings = render_k8s(
        targets, Options(rel, args.image, args.namespace, args.api_key_secret, args.router_image), header
    )
    if args.output:
        _write_output(args.output, "hwprofile", "k8s", text)
    else:
        sys.stdout.write(text)
    for w in [*notes, *warnings]:
        print(f"hwprofile: warning: k8s: {w}", file=sys.stderr)
    return EXIT_OK


def _node_targets(args: argparse.Namespace) -> tuple[Release, list[Target], list[str], list[str]]:
    """``--nodes FILE``: the release rendered for, one target per GPU class of the cluster's nodes,
    the header that says them, and the nodes left out (warnings)."""
    from ..config.layers import config_root
    from ..pipeline import PlanInputs
    from ..render.k8s import Target
    from ..render.k8s.nodes import node_classes
    from ..render.versions import known_versions, parse_version, release

    version = args.vllm_version or max(known_versions(), key=parse_version)
    if not args.vllm_version:
        print(
            f"hwprofile: k8s: no --vllm-version: rendering for vLLM {version}, the newest release "
            "hwprofile knows",
            file=sys.stderr,
        )
    rel = release(version)
    try:
        classes, notes = node_classes(_read_nodes(args.nodes), rel.target)
    except ValueError as e:
        raise CliError(f"--nodes {args.nodes}: {e}") from None
    if not classes:
        raise CliError(
            f"--nodes {args.nodes}: no node with GPU Feature Discovery's nvidia.com/gpu.product "
            "label and an allocatable nvidia.com/gpu" + "".join(f"; {n}" for n in notes)
        )
    root = config_root(args.config_root)
    products = [c.product for c in classes]  # one product in two classes: the count and memory name them
    targets = [
        Target(
            c.product,
            c.selector,
            c.nodes,
            len(c.nodes),
            PlanInputs(
                c.snapshot,
                root,
                args.profile,
                tuple(args.overrides),
                tuple(args.sets),
                args.model,
                args.draft,
            ),
            c.assumed,
            f"{c.gpu_count}x{c.memory_mib}mib" if products.count(c.product) > 1 else "",
        )
        for c in classes
    ]
    header = (
        [f"from the nodes of {args.nodes}: {len(classes)} GPU class(es)"]
        + [
            f"{c.product}: {c.gpu_count} GPU(s) x {c.memory_mib} MiB on {len(c.nodes)} node(s)"
            for c in classes
        ]
        + list(notes)
    )
    return rel, targets, header, list(notes)


def _read_nodes(path: str):  # -> the parsed JSON document
    """``--nodes FILE``: at most 64 MiB of strict JSON (a file, a pipe, or - for standard input)."""
    from ..contracts import BadJson, parse_json
    from ..runtime.files import read_bounded

    cap = 64 << 20
    try:
        raw = sys.stdin.buffer.read(cap + 1) if path == "-" else read_bounded(path, cap, pipe=True)
    except OSError as e:
        raise CliError(f"--nodes {path}: {e.strerror or e}") from None
    if len(raw) > cap:
        raise CliError(f"--nodes {path}: more than {cap} bytes")
    try:
        return parse_json(raw)
    except BadJson as e:
        raise CliError(f"--nodes {path}: {e}") from None


def _write_output(directory: str, name: str, fmt: str, text: str) -> None:
    """One rendered file into ``--output DIR``, atomically, never through a link (env files 0600)."""
    import errno
    import os

    from ..render.output import UnsafeValue, output_path
    from ..runtime.files import WriteError, atomic_write

    d = os.path.abspath(directory)
    if os.path.islink(d) and not os.path.exists(d):
        raise CliError(f"--output {directory}: a symbolic link to nothing ({os.readlink(d)})")
    if os.path.lexists(d) and not os.path.isdir(d):
        raise CliError(f"--output {directory}: not a directory")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        why = "a part of it is not a directory" if e.errno in (errno.ENOTDIR, errno.EEXIST) else e.strerror
        raise CliError(f"--output {directory}: cannot create the directory: {why}", EXIT_FAILED) from None
    try:
        path = output_path(d, name, fmt)
    except UnsafeValue as e:
        raise CliError(f"--output {directory}: {e}") from None
    try:
        atomic_write(path, text, 0o600 if fmt == "env" else 0o644)
    except WriteError as e:
        raise CliError(str(e), EXIT_FAILED) from None
    print(path)
