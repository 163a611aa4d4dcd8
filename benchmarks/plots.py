"""The benchmark plots, written as PNG files with matplotlib's Agg backend.

Every function takes times in seconds, writes one figure and returns it, so that callers
(and tests) can inspect what was plotted. The figures are built without pyplot: no display,
no global matplotlib state.
"""

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

DPI = 120
STEP_TIME = "time of one step (s)"


def plot_time_vs_qubits(
    series: Mapping[str, Mapping[int, float]], path: Path, title: str
) -> Figure:
    """One line per configuration: the time of one step (log scale) against the number of
    qubits. A configuration's missing sizes are left out of its line."""
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for label, times in series.items():
        qubits = sorted(times)
        axes.plot(qubits, [times[n] for n in qubits], marker="o", label=label)
    _log_seconds(axes)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("qubits")
    axes.set_ylabel(STEP_TIME)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    _save(figure, path)
    return figure


def plot_deferred_vs_eager(
    times: Mapping[str, tuple[float, float]], path: Path, title: str
) -> Figure:
    """Grouped bars, one group per workload: the deferred and the eager time (log scale),
    with the eager/deferred ratio (the speed-up of deferred accumulation) above each group."""
    figure = Figure(figsize=(max(8.0, 1.1 * len(times) + 2), 5), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(times))
    width = 0.4
    deferred = [pair[0] for pair in times.values()]
    eager = [pair[1] for pair in times.values()]
    axes.bar(positions - width / 2, deferred, width, label="deferred (default)")
    axes.bar(positions + width / 2, eager, width, label="eager")
    for position, (deferred_s, eager_s) in zip(positions, times.values(), strict=True):
        axes.annotate(
            f"{eager_s / deferred_s:.2f}x",
            (position, max(deferred_s, eager_s)),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
        )
    axes.set_xticks(positions, list(times))
    _log_seconds(axes)
    # Bars on a log scale need a bottom: a third of the fastest time; room at the top for
    # the ratios and the legend.
    axes.set_ylim(min(deferred + eager) / 3, max(deferred + eager) * 4)
    axes.set_ylabel(STEP_TIME)
    axes.set_title(title)
    axes.grid(True, axis="y", which="both", alpha=0.3)
    axes.legend(title="above each pair: eager / deferred")
    _save(figure, path)
    return figure


def _log_seconds(axes: Axes) -> None:
    """A log-scale y axis labelled in plain seconds (0.05, not 5e-2): every power of ten
    and, between them, 2, 3 and 5 times it."""
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(FuncFormatter(_minor_tick))


def _minor_tick(value: float, _position: int) -> str:
    leading = round(value / 10 ** np.floor(np.log10(value)))
    return f"{value:g}" if leading in (2, 3, 5) else ""


def _save(figure: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)  # attaches itself to the figure: savefig renders with Agg
    figure.savefig(path, dpi=DPI)
