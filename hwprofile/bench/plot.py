"""The picture of a benchmark: output throughput and p99 TTFT against concurrency, one line per
plan (the median over rounds, the rounds' range as error bars), the p99 TTFT target as a dashed
line. matplotlib (the ``bench`` extra) with the Agg backend, imported here only. What was drawn is
read back from the figure itself and returned, so the result JSON says which axes and lines the
PNG has."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# plan label -> [(concurrency, output tokens/s (median, lo, hi), p99 TTFT ms (median, lo, hi))]
Series = Mapping[str, Sequence[tuple[int, tuple[float, float, float], tuple[float, float, float]]]]

WIDTH_IN, HEIGHT_IN, DPI = 11.0, 4.5, 100


def plot(
    series: Series, target_ms: float, path: Path, title: str, knees: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Write the PNG to ``path`` (``atomic_write``); return its record:
    file, pixel size, and per axis its title, axis labels and line labels as the figure has them.
    ``knees``: plan label -> the recommended concurrency of a sweep that broke the target, drawn as a
    dotted vertical line on both axes in the plan's colour."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    thr, ttft = fig.subplots(1, 2)
    concs = sorted({c for pts in series.values() for c, _, _ in pts})
    _draw_series(thr, ttft, series, knees or {})
    ttft.axhline(target_ms, linestyle="--", color="red", label=f"target {target_ms:g} ms")
    for ax, ylabel, name in (
        (thr, "output tokens/s", "throughput vs concurrency"),
        (ttft, "p99 TTFT (ms)", "p99 TTFT vs concurrency"),
    ):
        ax.set_title(name)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        if len(concs) > 2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(concs)
        ax.set_xticklabels([str(c) for c in concs])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    thr.set_ylim(bottom=0)
    ttft.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    path = Path(path)
    atomic_write(path, buf.getvalue())
    return _record(fig, (thr, ttft), path)


def _draw_series(thr: Axes, ttft: Axes, series: Series, knees: Mapping[str, int]) -> None:
    """Each plan's medians with the rounds' range as error bars on both axes, and its knee (when
    given) as a dotted vertical line in the plan's colour."""
    for label, pts in series.items():
        pts = sorted(pts)
        xs = [c for c, _, _ in pts]
        for ax, vals in ((thr, [p[1] for p in pts]), (ttft, [p[2] for p in pts])):
            med = [v[0] for v in vals]
            err = [[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]]
            bars = ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
            knee = knees.get(label)
            if knee is not None:
                colour = bars.lines[0].get_color()
                ax.axvline(knee, linestyle=":", color=colour, label=f"knee {label}: {knee}")


def _record(fig: Figure, axes: tuple[Axes, Axes], path: Path) -> dict[str, Any]:
    """What the figure has, read back from it: file, pixel size, each axis's titles and line labels."""
    w, h = fig.canvas.get_width_height()
    return {
        "file": path.name,
        "width_px": int(w),
        "height_px": int(h),
        "axes": [
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "lines": _legend_lines(ax),
            }
            for ax in axes
        ],
    }


def _legend_lines(ax: Axes) -> list[str]:
    """The labels of ``ax``'s legend (every axis is drawn with one: none is no line)."""
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []
