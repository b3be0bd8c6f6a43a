"""The report's figures, drawn with matplotlib's Agg backend (no display needed). Names in titles and
legends come from results files: they are drawn as plain text (`_label`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import BinaryIO, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from hf_securesd.bench.terminal import readable  # noqa: E402

KIND_COLORS = {"safety": "tab:red", "utility": "tab:blue"}
NOTHING = "nothing to plot\n(no relaxed verifier cells; see report.md)"


def _label(text: str) -> str:
    """A name from a results file as plain text for a title or legend: control characters as
    escapes (`readable`, no missing-glyph warnings) and `$` escaped (never read as mathtext, whose
    parse errors would stop the report)."""
    return readable(text).replace("$", r"\$")


def _grid(count: int) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of `count` panels, three to a row; with none, one empty panel saying so (the figure
    is written all the same, so the report folder always holds both figures)."""
    if count == 0:
        figure, axis = plt.subplots(figsize=(4.2, 3.4))
        axis.set_axis_off()
        axis.text(0.5, 0.5, NOTHING, ha="center", va="center", transform=axis.transAxes, color="gray")
        return figure, []
    columns = min(3, max(1, count))
    rows = math.ceil(max(1, count) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    flat = [axis for row in axes for axis in row]
    for axis in flat[count:]:
        axis.set_visible(False)
    return figure, flat


def plot_prr_vs_ar(
    curves: Mapping[str, Mapping[tuple[str, str], Sequence[tuple[float, float]]]], path: Path | BinaryIO
) -> Path | BinaryIO:
    """Figure 1 analog. `curves[verifier][(kind, schedule label)]` = [(AR, PRR), ...]; one panel per
    verifier, safety in red and utility in blue, solid without a schedule and dashed with one."""
    figure, axes = _grid(len(curves))
    for axis, (verifier, series) in zip(axes, curves.items()):
        for (kind, schedule), points in series.items():
            points = sorted(point for point in points if all(math.isfinite(value) for value in point))
            if not points:
                continue
            xs, ys = zip(*points)
            axis.plot(
                xs,
                ys,
                marker="o" if schedule == "none" else "s",
                linestyle="-" if schedule == "none" else "--",
                color=KIND_COLORS.get(kind, "gray"),
                label=_label(f"{kind}, {schedule}"),
            )
        axis.set_title(_label(verifier))
        axis.set_xlabel("acceptance rate (AR)")
        axis.set_ylabel("PRR")
        axis.axhline(1.0, color="gray", linewidth=0.5)
        axis.axhline(0.0, color="gray", linewidth=0.5)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
        else:
            axis.text(
                0.5,
                0.5,
                "PRR undefined\n(target = draft scores)",
                ha="center",
                va="center",
                transform=axis.transAxes,
                color="gray",
            )
    figure.suptitle("PRR vs AR (1 = target alone, 0 = draft alone)")
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    plt.close(figure)
    return path


def plot_position_tv(
    bars: Mapping[str, Mapping[str, Sequence[float]]], path: Path | BinaryIO, positions: int = 16
) -> Path | BinaryIO:
    """Figure 2 analog. `bars[panel title][series label]` = mean TV(out_j, q_j) by response position
    j; grouped bars for the first `positions` positions."""
    figure, axes = _grid(len(bars))
    for axis, (title, series) in zip(axes, bars.items()):
        width = 0.8 / max(1, len(series))
        for index, (label, values) in enumerate(series.items()):
            values = [value if math.isfinite(value) else 0.0 for value in list(values)[:positions]]
            axis.bar([j + index * width for j in range(len(values))], values, width=width, label=_label(label))
        axis.set_title(_label(title), fontsize=9)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("response position j")
        axis.set_ylabel("mean TV(out_j, q_j)")
        axis.set_ylim(0, 1)
        if series:
            axis.legend(fontsize=7)
    figure.suptitle("Per-position deviation from the target")
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    plt.close(figure)
    return path
