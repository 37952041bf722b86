"""The verdict of ``hwprofile verify`` as a ``hwprofile.verify/1`` JSON document
(``schemas/hwprofile.verify-1.schema.json``) and as text for a person (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .compare import SIMILARITY, SIMILARITY_DESCRIPTION, Divergence, Verdict

SCHEMA = "hwprofile.verify/1"


def _divergence(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "index": d.index,
        "baseline": {"token_id": d.baseline.token_id, "text": d.baseline.text},
        "candidate": {"token_id": d.candidate.token_id, "text": d.candidate.text},
        "baseline_logprob": d.baseline_logprob,
        "candidate_logprob_at_baseline": d.candidate_logprob,
        "candidate_rank_at_baseline": d.candidate_rank,
        "margin": d.margin,
    }


def to_json(
    verdict: Verdict,
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    settings: Mapping[str, Any],
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``hwprofile.verify/1`` document. ``baseline`` and ``candidate`` describe the two servers
    (``url``, ``model``, ``source``, ``seconds`` and, when hwprofile served them, ``plan``);
    ``settings`` the requests (``max_tokens``, ``seed``, ``prompts_file``...)."""
    return {
        "schema": SCHEMA,
        "passed": verdict.passed,
        "similarity": {
            "name": SIMILARITY,
            "description": SIMILARITY_DESCRIPTION,
            "value": verdict.similarity,
            "min": verdict.min_similarity,
        },
        "exact_match_rate": verdict.exact_match_rate,
        "exact_matches": verdict.exact_matches,
        "prompts": verdict.prompts,
        "by_kind": verdict.by_kind(),
        "settings": dict(settings),
        "baseline": dict(baseline),
        "candidate": dict(candidate),
        "results": [
            {
                "id": r.id,
                "kind": r.kind,
                "exact": r.exact,
                "similarity": r.similarity,
                "baseline_tokens": r.baseline_tokens,
                "candidate_tokens": r.candidate_tokens,
                "baseline_finish": r.baseline_finish,
                "candidate_finish": r.candidate_finish,
                "first_difference": _divergence(r.divergence),
            }
            for r in verdict.results
        ],
        "notes": list(notes),
    }


def _side(name: str, s: Mapping[str, Any]) -> str:
    plan = s.get("plan") or {}
    bits = [f"{s.get('url')}", f"model {s.get('model')}"]
    if plan:
        bits.append(f"dtype {plan.get('dtype')}")
        spec = plan.get("speculative")
        bits.append(
            f"speculative {spec['method']} k={spec['num_speculative_tokens']}" if spec else "speculative off"
        )
    if s.get("seconds") is not None:
        bits.append(f"{s['seconds']:.1f} s")
    return f"{name:<9}  " + ", ".join(bits)


def _tok(t: Mapping[str, Any]) -> str:
    if t["token_id"] is None:
        return "(ended)"
    return f"{t['token_id']}" + (f" {t['text']!r}" if t.get("text") is not None else "")


def format_text(doc: Mapping[str, Any]) -> str:
    """The document for a person: the verdict first, then each divergent prompt's first difference."""
    sim = doc["similarity"]
    verdict = "PASS" if doc["passed"] else "FAIL"
    lines = [
        f"{verdict}: similarity {sim['value']:.4f} (bar {sim['min']}), exact match "
        f"{doc['exact_matches']}/{doc['prompts']} ({doc['exact_match_rate']:.1%})",
        f"similarity: {sim['description']}",
        _side("baseline", doc["baseline"]),
        _side("candidate", doc["candidate"]),
        "requests: " + ", ".join(f"{k} {v}" for k, v in doc["settings"].items()),
        "by kind:  "
        + "; ".join(
            f"{k} {v['exact_matches']}/{v['prompts']} exact, {v['similarity']:.4f}"
            for k, v in doc["by_kind"].items()
        ),
    ]
    divergent = [r for r in doc["results"] if not r["exact"]]
    if divergent:
        lines.append(f"divergent answers ({len(divergent)}):")
    for r in divergent:
        d = r["first_difference"]
        line = (
            f"  {r['id']:<10} token {d['index']} of {r['baseline_tokens']}/{r['candidate_tokens']}: "
            f"baseline {_tok(d['baseline'])}, candidate {_tok(d['candidate'])}; similarity {r['similarity']:.4f}"
        )
        if d["margin"] is not None:
            line += (
                f"; the baseline ranked the candidate's token {d['candidate_rank_at_baseline']} "
                f"({d['margin']:.4f} nats below its own)"
            )
        elif d["baseline_logprob"] is not None and d["candidate"]["token_id"] is not None:
            line += "; the candidate's token is not among the baseline's top tokens there"
        lines.append(line)
    for n in doc.get("notes") or ():
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"
