"""Readings from a real NVIDIA driver, and where they differ from the fake library the tests use.

Run on a GPU machine (no network needed; hwprofile and nvidia-ml-py are all it takes)::

    python tools/real_nvml.py --out DIR [--seconds 60]

It writes into DIR:

- ``host.json``: ``hwprofile detect --json`` of this host (a fixture for ``--from``);
- ``once.json``: two samples one second apart of every GPU, as ``hwprofile watch --once`` reads
  them, with each card's state by its reading (``policy.instant_level``);
- ``samples.json``: the daemon's sampler at 1 Hz for ``--seconds`` seconds (its readings and how long
  each sample took);
- ``differences.json`` and ``differences.txt``: every way the real driver answered that the fake
  library does not (errors by NVML function, fields without a value, clock-event bits the decoder
  does not name, the temperature margin, values outside the ranges the fake uses, sample times).

Nothing here writes to the GPUs or changes a setting. The tests run it against the fake library
(``tests/test_real_nvml.py``), where it must find no difference beyond the fake's own answers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hwprofile.host.sampler import GpuSampler
from hwprofile.host.snapshot import CLOCK_EVENT_REASONS

# What the fake library answers (tests/fakenvml/fakenvml.c and the fixture hosts): a real reading
# outside these is a difference worth a look (a unit, a scale, a sentinel value).
FAKE_RANGES = {
    "temperature_c": (0, 120),
    "slowdown_c": (40, 120),
    "shutdown_c": (50, 130),
    "sm_clock_mhz": (0, 4000),
    "sm_clock_max_mhz": (100, 4000),
    "power_draw_watts": (0, 1500),
    "power_limit_watts": (10, 1500),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "nvml-readings", help="output directory")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the 1 Hz sampling loop")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from hwprofile.config.settings import Watch
    from hwprofile.daemon.policy import instant_level
    from hwprofile.host.detect import detect_host

    t0 = time.perf_counter()
    host = detect_host()
    detect_s = time.perf_counter() - t0
    (out / "host.json").write_text(json.dumps(host.to_dict(), indent=2) + "\n")

    sampler = GpuSampler()
    watch = Watch()
    try:
        first = sampler.sample(time.monotonic())
        time.sleep(1.0)
        second = sampler.sample(time.monotonic())
        once = [
            {**_reading(r), "state_now": instant_level(r, watch)[0], "why": instant_level(r, watch)[1]}
            for r in second
        ]
        (out / "once.json").write_text(
            json.dumps({"first": [_reading(r) for r in first], "second": once}, indent=2) + "\n"
        )
        samples, took = [], []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            samples.append([_reading(r) for r in sampler.sample(time.monotonic())])
            took.append(time.perf_counter() - t)
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))
    finally:
        sampler.close()
    (out / "samples.json").write_text(
        json.dumps({"samples": samples, "sample_seconds": took}, indent=1) + "\n"
    )

    diff = differences(host.to_dict(), samples, took, sampler.error, detect_s)
    (out / "differences.json").write_text(json.dumps(diff, indent=2) + "\n")
    text = report(diff)
    (out / "differences.txt").write_text(text)
    sys.stdout.write(text)
    return 0


def _reading(r: Any) -> dict[str, Any]:
    return {k: getattr(r, k) for k in r.__dataclass_fields__} | {"headroom_c": r.headroom_c}


def differences(
    host: dict[str, Any],
    samples: list[list[dict[str, Any]]],
    took: list[float],
    sampler_error: str | None,
    detect_s: float,
) -> dict[str, Any]:
    """What the real driver answered that the fake does not: pure, from the saved readings."""
    errors: dict[str, list[str]] = {}
    for e in host.get("errors") or []:
        fn = e["message"].split(":", 1)[0]
        errors.setdefault(fn, []).append(f"{e['where']}: {e['message']}")
    missing = sorted(
        {f"gpu[{g['index']}].{k}" for g in host.get("gpus") or [] for k, v in g.items() if v is None}
    )
    named = set(CLOCK_EVENT_REASONS)
    unknown_bits = sorted(
        {
            bit
            for g in host.get("gpus") or []
            if g.get("clocks_event_reasons_mask")
            for bit in (1 << i for i in range(64))
            if g["clocks_event_reasons_mask"] & bit and bit not in named
        }
    )
    flat = [r for s in samples for r in s]
    out_of_range = sorted(
        {
            f"gpu[{r['index']}].{k} = {r[k]}"
            for r in flat
            for k, (lo, hi) in FAKE_RANGES.items()
            if r.get(k) is not None and not lo <= r[k] <= hi
        }
    )
    statuses: dict[str, int] = {}
    for r in flat:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    reading_errors = sorted({r["error"] for r in flat if r.get("error")})
    margins = sorted({r["index"] for r in flat if r.get("margin_c") is not None})
    return {
        "driver": host.get("driver"),
        "gpus": [g.get("name") for g in host.get("gpus") or []],
        "detect_seconds": round(detect_s, 3),
        "nvml_errors_by_function": errors,
        "fields_without_value": missing,
        "clock_event_bits_not_named": [hex(b) for b in unknown_bits],
        "values_outside_the_fakes_ranges": out_of_range,
        "sample_statuses": statuses,
        "sample_errors": reading_errors,
        "temperature_margin_on_gpus": margins,
        "sampler_error": sampler_error,
        "sample_seconds": {
            "p50": round(statistics.median(took), 4) if took else None,
            "max": round(max(took), 4) if took else None,
            "count": len(took),
        },
    }


def report(d: dict[str, Any]) -> str:
    lines = [f"driver {d['driver']}, GPUs {d['gpus']}, detect {d['detect_seconds']} s"]
    for key in (
        "nvml_errors_by_function",
        "fields_without_value",
        "clock_event_bits_not_named",
        "values_outside_the_fakes_ranges",
        "sample_errors",
    ):
        value = d[key]
        lines.append(f"{key}: {'none' if not value else ''}")
        items = value.items() if isinstance(value, dict) else ((v, None) for v in value)
        for k, v in items:
            lines.append(f"  {k}" + (f": {v}" if v else ""))
    lines.append(
        f"sample statuses: {d['sample_statuses']}; temperature margin read on GPUs {d['temperature_margin_on_gpus']}"
    )
    lines.append(f"sample seconds: {d['sample_seconds']}; sampler error: {d['sampler_error']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
