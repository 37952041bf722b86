"""Rebuild one release's entry of the options table (``options`` in hwprofile/data/vllm.json) from
that release's own ``vllm serve`` argument parser: every option string it accepts, with the choices
argparse enforces (else ``true``), in the parser's order. Run it with the Python of an environment
where that vLLM release is installed (any platform's build: the parser is the same)::

    python -m venv /tmp/v && /tmp/v/bin/pip install vllm==0.34.0
    /tmp/v/bin/python tools/vllm_options.py            # print the release's entry
    /tmp/v/bin/python tools/vllm_options.py --check    # exit 1 when the shipped entry differs
    /tmp/v/bin/python tools/vllm_options.py --update   # write it (and the version) into the table

It builds the parser the way ``vllm serve`` does (``vllm.entrypoints.cli.serve``'s subcommand,
vLLM 0.8 and later). The table's other sections (``values``, ``speculative``: read off each release's
source by a person, tools/build_vllm_table.py) and the named floors of hwprofile/release/facts.py are
not touched: a new release's entry here is what render and plan need to accept it, and
tests/test_release.py says what else a release number may change.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "hwprofile" / "data" / "vllm.json"


def release_version() -> str:
    """The installed vLLM's release, without a local build tag (``0.32.0+cpu`` is 0.32.0)."""
    import vllm

    m = re.match(r"\d+\.\d+\.\d+", vllm.__version__)
    if not m:
        raise SystemExit(f"vllm {vllm.__version__!r}: not a release version")
    return m.group(0)


def serve_options() -> dict[str, Any]:
    """Every option string of the installed release's ``vllm serve`` parser: its argparse choices
    (as strings, the parser's order) where it enforces them, else True; ``-h``/``--help`` left out."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before 0.11: in vllm.utils
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]  # old releases
    import vllm.entrypoints.cli.serve as serve

    parser = FlexibleArgumentParser(prog="vllm")
    sub = next(c for c in serve.cmd_init() if c.name == "serve").subparser_init(parser.add_subparsers())
    out: dict[str, Any] = {}
    for action in sub._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            out[opt] = [str(c) for c in action.choices] if action.choices is not None else True
    return out


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def update(table: dict[str, Any], version: str, options: dict[str, Any]) -> dict[str, Any]:
    """``table`` with ``version``'s options set and the version listed (in release order)."""
    new = dict(table)
    new["options"] = {**table["options"], version: options}
    new["options"] = dict(sorted(new["options"].items(), key=lambda kv: _version_key(kv[0])))
    new["versions"] = sorted({*table["versions"], version}, key=_version_key)
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--table", default=str(TABLE), help="the table to check or update (default: the shipped one)"
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the table's entry differs")
    mode.add_argument("--update", action="store_true", help="write the entry into the table")
    args = ap.parse_args(argv)
    version, options = release_version(), serve_options()
    path = Path(args.table)
    table = json.loads(path.read_text(encoding="utf-8"))
    if args.check:
        have = table["options"].get(version)
        if have == options:
            print(f"vLLM {version}: the table's {len(options)} options are the parser's")
            return 0
        if have is None:
            print(f"vLLM {version}: not in {path} (--update adds it)", file=sys.stderr)
            return 1
        gone, new = sorted(set(have) - set(options)), sorted(set(options) - set(have))
        changed = sorted(k for k in set(have) & set(options) if have[k] != options[k])
        print(
            f"vLLM {version}: the table differs from the parser: not in the parser {gone}, not in the "
            f"table {new}, other choices {changed}",
            file=sys.stderr,
        )
        return 1
    if args.update:
        text = json.dumps(update(table, version, options), separators=(",", ":"), ensure_ascii=False)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        print(f"vLLM {version}: {len(options)} options written to {path}")
        return 0
    json.dump({"version": version, "options": options}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
