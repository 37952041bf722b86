"""``hwprofile detect``, ``profiles`` and ``doctor``: what this host is, which profile it gets, what
stands between it and a working vLLM."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import EXIT_OK
from .common import load_host

if TYPE_CHECKING:
    from ..host.snapshot import HostSnapshot
    from .doctor import Finding


def cmd_detect(args: argparse.Namespace) -> int:
    host = load_host(args)
    if args.json:
        sys.stdout.write(host.to_json() + "\n")
    else:
        from .views import format_host

        sys.stdout.write(format_host(host))
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    from ..config.layers import config_root
    from ..match import profiles as prof
    from ..match.rules import host_facts, load_rules, match

    host = load_host(args)
    root = config_root(args.config_root)
    profiles = prof.load_profiles(root)
    winner, results = match(load_rules(root), host_facts(host))
    if args.json:
        import json

        out = {
            "chosen": winner.rule.profile if winner else None,
            "profiles": [
                {
                    "name": p.name,
                    "file": p.path,
                    "kind": p.kind,
                    "extends": p.parent,
                    "description": p.description,
                }
                for p in sorted(profiles.values(), key=lambda p: p.name)
            ],
            "rules": [
                {
                    "profile": res.rule.profile,
                    "rule": f"{res.rule.file}:{res.rule.line}",
                    "why": res.rule.why,
                    "matched": res.matched,
                    "chosen": res is winner,
                    "checks": [
                        {"predicate": c.predicate, "ok": c.ok, "detail": c.detail} for c in res.checks
                    ],
                }
                for res in results
            ],
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return EXIT_OK
    from .views import format_profiles

    sys.stdout.write(format_profiles(profiles, results, winner))
    return EXIT_OK


def _live_hardware(args: argparse.Namespace, host: HostSnapshot) -> list[Finding]:
    """This host's GPUs read once more, live (not for a snapshot given with --from): faults, power limits."""
    from .doctor import check_hardware

    given: list[HostSnapshot] = (getattr(args, "_loaded_hosts", None) or ([], []))[0]  # snapshots from --from
    if given or not host.usable_gpus:
        return []
    from ..config.settings import Degrade
    from ..host.sampler import GpuSampler

    s = GpuSampler([g.index for g in host.usable_gpus])
    try:
        if s.error:
            return []
        readings = list(s.sample(0.0))
        power = {g: s.power_limits(g) for g in sorted(s.handles)}
    finally:
        s.close()
    return check_hardware(readings, power, Degrade().power_limit_factor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import check, exit_code, fix, format_text, to_json

    host = load_host(args)
    if getattr(args, "interconnect", False):
        return _doctor_interconnect(args, host)
    live = _live_hardware(args, host)
    findings = check(host) + live
    fixed = None
    if args.fix:
        fixed = fix(findings)
        if fixed.done or fixed.failed:
            findings = check(host) + live  # the exit status reflects the state after the fix
    if args.json:
        import json

        sys.stdout.write(json.dumps(to_json(findings, fixed), indent=2) + "\n")
    else:
        sys.stdout.write(format_text(findings, fixed, fix_requested=args.fix))
    return exit_code(findings)


def _doctor_interconnect(args: argparse.Namespace, host) -> int:  # host: HostSnapshot
    import json

    from ..config.layers import config_root
    from ..errors import InputError
    from ..interconnect.check import run_check
    from ..interconnect.store import save_report
    from ..plan.candidates import host_fingerprint
    from ..plan.interconnect import decide
    from ..runtime.files import WriteError
    from .views import format_interconnect

    usable = [g.index for g in host.usable_gpus]
    try:
        groups = [tuple(int(x) for x in g.split(",")) for g in (args.group or ())]
    except ValueError:
        raise InputError(f"--group {args.group}: expected GPU indexes like 0,1") from None
    if usable:
        backend = "nccl"
        groups = groups or [tuple(usable)]
        unknown = sorted({i for g in groups for i in g} - set(usable))
        if unknown:
            raise InputError(f"--group names GPUs {unknown}: not usable GPUs here ({usable})")
    else:
        backend = "gloo"
        groups = groups or [tuple(range(max(2, args.ranks)))]
    groups = [g for g in groups if len(g) > 1]
    report = run_check(
        groups,
        fingerprint=host_fingerprint(host),
        backend=backend,
        deadline_s=args.deadline,
        driver_version=host.driver.version,
        iommu=host.interconnect.iommu,
    )
    saved = None
    try:
        saved = save_report(config_root(args.config_root), host, report)
    except (OSError, WriteError) as e:
        sys.stderr.write(f"hwprofile: the result is not recorded: {e}\n")
    decisions = [decide(report, g) for g in groups]
    if args.json:
        out = {
            "interconnect": host.to_dict()["interconnect"],
            "p2p": [lk._asdict() for lk in host.gpu_links],
            "check": report.to_dict(),
            "decisions": [d._asdict() for d in decisions],
            "recorded": saved,
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(format_interconnect(host, report, decisions, saved))
    return 0 if all(r.outcome == "ok" for r in report.runs if r.p2p) else 1
