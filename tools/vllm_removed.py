"""Rebuild hwprofile/release/removed.json, the architectures vLLM no longer serves, from a release's
own list of them: ``_PREVIOUSLY_SUPPORTED_MODELS`` in ``vllm/model_executor/models/registry.py``
(architecture class -> the last release that served it; vLLM refuses such a model by name, "was
supported in vLLM until vX, and is not supported anymore"). The file is read as Python source, not
imported, so any platform's wheel will do::

    pip download --no-deps vllm==0.34.0 -d /tmp/v && unzip -q /tmp/v/vllm-*.whl 'vllm/*' -d /tmp/v/x
    python tools/vllm_removed.py 0.34.0=/tmp/v/x/vllm/model_executor/models/registry.py --check
    python tools/vllm_removed.py 0.34.0=/tmp/v/x/vllm/model_executor/models/registry.py --update

Without an argument it reads the vLLM installed beside this Python (found, not imported). Entries
the table has from earlier releases stay (an architecture a later release drops from its list is
still not served); an architecture given two different last releases stops the script: a person
reads both before the planner acts on either. ``--check`` exits 1 when the shipped table lacks an
entry of the registry read or differs in one (tests/test_release.py runs it on the installed vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vllm_registry import REGISTRY, REMOVED, installed, removed, sources

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "hwprofile" / "release" / "removed.json"


def merged(table: dict[str, Any], release: str, found: dict[str, str]) -> dict[str, Any]:
    """``table`` with ``found`` (read off ``release``) added; a conflicting entry stops the script."""
    last = dict(table.get("last_serving", {}))
    for arch, version in found.items():
        if last.get(arch, version) != version:
            raise SystemExit(f"{arch}: the table says {last[arch]}, vLLM {release} says {version}: read both")
        last[arch] = version
    read = sorted({*table.get("read_from", []), release}, key=lambda v: tuple(int(x) for x in v.split(".")))
    return {
        "source": f"vllm/{'/'.join(REGISTRY)} {REMOVED}: architecture -> the last release serving it",
        "read_from": read,
        "last_serving": dict(sorted(last.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "registry", nargs="*", help="RELEASE=PATH of a registry.py (default: the installed vLLM's)"
    )
    ap.add_argument(
        "--table", default=str(TABLE), help="the table to check or update (default: the shipped one)"
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="exit 1 when the table lacks or differs in an entry"
    )
    mode.add_argument("--update", action="store_true", help="write the entries into the table")
    args = ap.parse_args(argv)
    pairs = sources(args.registry)
    if not pairs:
        here = installed()
        if here is None:
            raise SystemExit("no vLLM installed here: give RELEASE=PATH of a registry.py")
        pairs = [here]
    path = Path(args.table)
    table = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    new = table
    for release, registry in pairs:
        new = merged(new, release, removed(registry))
    if args.check:
        have = table.get("last_serving", {})
        wrong = sorted(a for a, v in new["last_serving"].items() if have.get(a) != v)
        if wrong:
            print(f"{path}: missing or different: {wrong} (--update writes them)", file=sys.stderr)
            return 1
        print(f"{path}: every entry of {[r for r, _ in pairs]} is in the table")
        return 0
    text = json.dumps(new, indent=1) + "\n"
    if args.update:
        path.write_text(text, encoding="utf-8")
        print(f"{len(new['last_serving'])} architectures written to {path}")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
