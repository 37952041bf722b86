"""Rebuild the ``speculative`` section of hwprofile/data/vllm.json from the shared facts.

    python tools/build_vllm_table.py [--facts ../shared/facts] [--check]

The facts (``vllm-flags.json``, read off each release's own source) describe every release in
words; the renderer needs a few closed answers per release. Each answer is mapped from the facts'
own status text through the tables below, and a status text this script does not know stops it:
a new fact must be read by a person before the renderer acts on it. ``--check`` exits 1 when the
shipped table differs from what the facts give (tests/test_render_facts.py runs the same check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "hwprofile" / "data" / "vllm.json"

# facts' status text -> what the renderer does with it
DISABLE_BY_BATCH = {
    "honoured": "honoured",
    "honoured (V0, the default engine)": "honoured",
    "honoured (V0, the default for speculation)": "honoured",
    # 0.8.2: the legacy flags run on V0 (hwprofile renders legacy flags on 0.8.2)
    "honoured with the legacy flag; ignored with --speculative-config on CUDA": "honoured",
    "honoured only on V0 (draft_model / mlp_speculator / no method key); ignored on V1 (ngram, eagle, eagle3, deepseek_mtp, medusa)": "draft_model_only",
    "ignored": "ignored",
    "absent": "absent",
}
PRESENT = {"absent": False}  # any other status of a field that exists: honoured in some form
CHUNKED = {
    "refused": "refused",
    "ok, with two exceptions": "draft_tp_1",  # 0.6.4: a draft model with chunked prefill needs draft TP 1
    "ok": "ok",
    "ok, except EAGLE": "ok",
    "ok, except EAGLE on V0": "ok",
}
CPU = {
    "not applied": "not_applied",
    "ok (source, V0)": "ok",
    "refused on V1 (default on x86); V0 path ok (source)": "draft_model_only",
    "refused": "refused",
    "ok (source)": "ok",
    "ok (verified at run time)": "ok",
}


def _status(value: Any) -> str:
    return value["status"] if isinstance(value, dict) else str(value)


def _pick(table: dict[str, str], status: str, what: str, version: str) -> str:
    if status not in table:
        raise SystemExit(f"{version}: {what} status {status!r} is new to this script: read it, then map it")
    return table[status]


def build(facts: Path) -> dict[str, Any]:
    spec = json.loads((facts / "vllm-flags.json").read_text())["speculative_config"]
    out: dict[str, Any] = {}
    for version, x in spec.items():
        h, c = x["honoured"], x["constraints"]
        json_form = bool(x["cli"]["speculative_config_flag"]) and version != "0.8.2"
        per_batch = _status(h["num_speculative_tokens_per_batch_size"])
        hetero = _status(h["use_heterogeneous_vocab"])
        vocab = c.get("draft_vocab", "")
        out[version] = {
            "form": "json" if json_form else "legacy",
            "keys": list(x["keys"]),
            "methods": list(x["methods"]),
            "unknown_keys": _status(x["unknown_keys"]),
            "disable_by_batch_size": _pick(
                DISABLE_BY_BATCH, _status(h["disable_by_batch_size"]), "disable_by_batch_size", version
            ),
            "per_batch_size": PRESENT.get(per_batch, True),
            "heterogeneous_vocab": PRESENT.get(hetero, True),
            "draft_model": "no separate draft models" not in vocab,
            "chunked_prefill": _pick(
                CHUNKED, _status(c["chunked_prefill_with_speculation"]), "chunked prefill", version
            ),
            "cpu": _pick(CPU, _status(c["cpu_backend"]), "CPU backend", version),
            "awq_forces_legacy_kernel": bool(
                (x.get("awq") or {}).get("quantization_awq_forces_legacy_kernel")
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--facts", type=Path, default=ROOT.parent / "shared" / "facts")
    p.add_argument("--check", action="store_true", help="compare only; exit 1 when the table is stale")
    a = p.parse_args(argv)
    data = json.loads(TABLE.read_text())
    new = build(a.facts)
    if a.check:
        if data["speculative"] != new:
            stale = sorted(
                v for v in set(new) | set(data["speculative"]) if data["speculative"].get(v) != new.get(v)
            )
            print(f"hwprofile/data/vllm.json is stale for {', '.join(stale)}: run tools/build_vllm_table.py")
            return 1
        print("hwprofile/data/vllm.json: speculative table matches the facts")
        return 0
    data["speculative"] = new
    TABLE.write_text(json.dumps(data, separators=(",", ":")))
    print(f"wrote the speculative table of {len(new)} releases into {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
