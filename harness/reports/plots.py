"""The report's PNG plots, drawn from rows that `harness.reports.render` has already extracted.

Figures are built on the Agg canvas directly, not through pyplot: pyplot keeps global state and
picks a backend for the whole process, and this runs inside pytest sessions and other people's
programs.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 120
MODE_STYLE = {  # mode key in the latency rows -> (legend label, colour)
    "eager": ("eager (no graph)", "tab:red"),
    "piecewise": ("PIECEWISE graphs", "tab:orange"),
    "full": ("FULL graph", "tab:blue"),
}


def _figure(title: str, xlabel: str, ylabel: str):
    figure = Figure(figsize=(8, 4.8), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.3)
    return figure, axes


def _batch_axis(axes, batches: list[int]) -> None:
    # Log scale for the batch, labelled with the batches measured rather than powers of two.
    axes.set_xscale("log", base=2)
    axes.minorticks_off()
    axes.set_xticks(batches, labels=[str(b) for b in batches])


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    return path


def latency(rows: list[dict], label: str, path: Path) -> Path:
    """Median step latency per mode against batch, over the summed kernel time of an eager step."""
    figure, axes = _figure(f"Decode step latency: {label}", "decode batch (requests, log scale)",
                           "median step latency (ms)")
    for mode, (name, colour) in MODE_STYLE.items():
        points = [(r["batch"], r[mode]) for r in rows if r[mode] is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=name, color=colour)
    floor = [(r["batch"], r["floor"]) for r in rows if r["floor"] is not None]
    if floor:
        axes.plot(*zip(*floor), linestyle="--", color="grey", label="summed GPU kernel time, eager step")
    _batch_axis(axes, [r["batch"] for r in rows])
    axes.set_ylim(bottom=0)
    axes.legend()
    return _save(figure, path)


def speedup(rows: list[dict], label: str, path: Path) -> Path:
    """eager/FULL and eager/PIECEWISE step-time ratios against batch; above 1 the graph pays."""
    figure, axes = _figure(f"Speed-up over eager: {label}", "decode batch (requests, log scale)",
                           "eager step time / graph step time (x)")
    for mode in ("full", "piecewise"):
        points = [(r["batch"], r["eager"] / r[mode]) for r in rows if r["eager"] and r[mode]]
        if points:
            name, colour = MODE_STYLE[mode]
            axes.plot(*zip(*points), marker="o", label=f"eager / {name}", color=colour)
    axes.axhline(1.0, color="black", linestyle=":", label="no gain (1x)")
    _batch_axis(axes, [r["batch"] for r in rows])
    axes.set_ylim(bottom=0)
    axes.legend()
    return _save(figure, path)


def padding_waste(waste_by_grid: dict[str, list[tuple[int, float]]], label: str, path: Path) -> Path:
    """Padding waste (percent of the padded step) for every batch from 1 to each grid's largest size."""
    figure, axes = _figure(f"Padding waste per batch: {label}", "decode batch (requests)",
                           "padded rows / padded size (%)")
    # Largest grid first, so a smaller grid's line (the same up to its max) stays visible on top.
    for config, points in sorted(waste_by_grid.items(), key=lambda item: -len(item[1])):
        axes.plot(*zip(*points), linewidth=1, label=f"grid {config}")
    axes.set_xlim(1, max(len(points) for points in waste_by_grid.values()))
    axes.set_ylim(bottom=0)
    axes.legend()
    return _save(figure, path)
