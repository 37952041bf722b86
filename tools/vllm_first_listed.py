"""Rebuild hwprofile/release/first_listed.json, the first release whose model registry lists each
architecture class, from the registries of several releases: every ``_*_MODELS`` table of
``vllm/model_executor/models/registry.py`` (text generation, multimodal, pooling, speculative, the
Transformers backend's) but the list of removed ones. The files are read as Python source, not
imported, so any platform's wheel will do::

    for v in 0.6.3 0.6.4 ... 0.33.0; do
        pip download -q --no-deps --only-binary :all: vllm==$v -d /tmp/w$v
        unzip -q -j /tmp/w$v/vllm-*.whl vllm/model_executor/models/registry.py -d /tmp/r$v
    done
    python tools/vllm_first_listed.py 0.6.3=/tmp/r0.6.3/registry.py ... --update

An architecture already listed by the oldest release read gets no entry (nothing is known of the
releases before it). Each entry keeps the newest release read that did not list it: a release at or
below that one is known not to list it; one between it and the first listing was not read. The
table also says from which release read the registry has the Transformers backend
(``TransformersForCausalLM``), through which vLLM may serve an architecture it does not list.
``--check`` exits 1 when the shipped table differs from what the registries given say.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_registry import listed, sources

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "hwprofile" / "release" / "first_listed.json"
BACKEND = "TransformersForCausalLM"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def table(sources: list[tuple[str, Path]]) -> dict[str, object]:
    """The table the registries given make (their releases read oldest first)."""
    by_release = sorted(((v, listed(p)) for v, p in sources), key=lambda vp: _key(vp[0]))
    oldest = by_release[0][1]
    first: dict[str, list[str]] = {}
    for i, (version, names) in enumerate(by_release):
        for arch in sorted(names - oldest):
            if arch not in first:
                first[arch] = [by_release[i - 1][0], version]
    backend = next((v for v, names in by_release if BACKEND in names), None)
    return {
        "source": "vllm/model_executor/models/registry.py _*_MODELS: architecture -> "
        "[the newest release read without it, the first release read listing it]",
        "read_from": [v for v, _ in by_release],
        "transformers_backend_from": backend,
        "first_listed": dict(sorted(first.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("registry", nargs="+", help="RELEASE=PATH of a registry.py, one per release read")
    ap.add_argument("--table", default=str(TABLE), help="the table to check or update")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the table differs")
    mode.add_argument("--update", action="store_true", help="write the table")
    args = ap.parse_args(argv)
    new = table(sources(args.registry))
    path = Path(args.table)
    text = json.dumps(new, indent=1) + "\n"
    if args.check:
        have = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if have != new:
            print(f"{path}: differs from the registries given (--update writes them)", file=sys.stderr)
            return 1
        print(f"{path}: as the registries of {new['read_from']} say")
        return 0
    if args.update:
        path.write_text(text, encoding="utf-8")
        print(f"{len(new['first_listed'])} architectures written to {path}")  # type: ignore[arg-type]
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
