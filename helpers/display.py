"""Show results: bandwidth plots, summary tables, and kernel sources.

Introduced in chapter 1. Every plot of the book puts GB/s against size (or a
knob) with the copy ceiling as a line, and names the GPU and date of the run.
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from .arith import ceil_div
from .operands import DTYPES
from .paths import kernel_path

MIB = 1 << 20


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def input_bytes(row) -> int:
    """The size of a row's input in bytes: its shape times its element size."""
    itemsize = (DTYPES.get(row.dtype) or np.dtype(row.dtype)).itemsize  # DTYPES knows bfloat16
    return int(np.prod(row.shape, dtype=np.int64)) * itemsize


def plot_bandwidth(ax, series: dict, *, ceiling_gbs: float, label: str, x: str = "size",
                   xlabel: str = "input size", baselines: dict = None, ylabel: str = "GB/s (bytes read + written)"):
    """Lines of GB/s: ``series`` maps a legend label to rows (``Row``s); x is 'size'
    (bytes of the input, log axis), 'cols' (the row length of a matrix, log axis) or
    a config key. Baselines are drawn dashed."""
    def value(r):
        return input_bytes(r) if x == "size" else r.shape[-1] if x == "cols" else r.config[x]

    def xs(rows):
        return [value(r) for r in rows]

    for name, rows in series.items():
        rows = [r for r in rows if r is not None]
        if rows:
            ax.plot(xs(rows), [r.gbs for r in rows], marker="o", ms=4, label=name)
    styles = [("--", "s", "0.3"), (":", "^", "0.45"), ("-.", "D", "0.6"), ((0, (5, 1, 1, 1)), "v", "0.2")]
    for (name, rows), (line, marker, grey) in zip((baselines or {}).items(), styles * 4):
        rows = [r for r in rows if r is not None]
        if rows:
            ax.plot(xs(rows), [r.gbs for r in rows], ls=line, marker=marker, ms=3, color=grey, label=name)
    ax.axhline(ceiling_gbs, color="crimson", lw=1, ls=":", label=f"copy ceiling {ceiling_gbs:,.0f} GB/s")
    if x in ("size", "cols"):
        ax.set_xscale("log", base=2)
        ticks = sorted({value(r) for rows in series.values() for r in rows if r is not None})
        ticks = ticks[::ceil_div(len(ticks), 6)]  # at most six labels: they must not overlap
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) if x == "size" else f"{t:,}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, ceiling_gbs * 1.15)
    ax.grid(alpha=0.3)
    ax.set_title(label, fontsize=9, loc="right", color="0.3")
    ax.legend(fontsize=8, loc="lower right")


def summary_table(rows: list, *, ceiling_gbs: float, names: list = None, reference=None) -> Markdown:
    """A Markdown table: µs (median, with the interquartile range), GB/s, % of
    the copy ceiling, speed-up over ``reference`` and the error vs float64. The config
    column leaves out ``in_turns_with`` (which rows were timed together: the cell says so)."""
    lines = ["| step | config | µs (median) | IQR µs | GB/s | % of ceiling |"
             + (" speed-up |" if reference else "") + " rel. error |",
             "|---|---|---:|---:|---:|---:|" + ("---:|" if reference else "") + "---:|"]
    for i, row in enumerate(rows):
        if row is None:
            continue
        name = names[i] if names else row.provider
        config = ", ".join(f"{k}={v}" for k, v in row.config.items() if k != "in_turns_with") or "–"
        iqr = f"{(row.ms_q3 - row.ms_q1) * 1e3:.1f}" if row.ms_q1 is not None else "–"
        err = "–" if row.rel_err is None else f"{row.rel_err:.1e}"
        speedup = f" {reference.ms / row.ms:.2f}× |" if reference else ""
        lines.append(f"| {name} | {config} | {row.ms * 1e3:,.1f} | {iqr} | {row.gbs:,.0f} | "
                     f"{row.pct_of(ceiling_gbs):.1f}% |{speedup} {err} |")
    return Markdown("\n".join(lines))


def kernel_source(file: str, name: str) -> str:
    """The source of one kernel (its comment block, template line and body) from a .cu file."""
    lines = kernel_path(file).read_text().splitlines()
    pattern = re.compile(rf"\b{re.escape(name)}\s*[({{]")
    starts = [i for i, line in enumerate(lines) if pattern.search(line) and not line.strip().startswith("//")]
    if not starts:
        raise KeyError(f"no kernel {name!r} in {file}")
    first = last = starts[0]
    def ends_a_definition(line: str) -> bool:  # "}" or a one-line "{ ... }" / declaration
        line = line.strip()
        return not line.startswith("//") and (line.startswith("}") or line.endswith(("}", ";")))

    while first > 0 and lines[first - 1].strip() and not ends_a_definition(lines[first - 1]):
        first -= 1  # up through the template line and the comment above it
    depth, opened = 0, False
    for last in range(starts[0], len(lines)):
        depth += lines[last].count("{") - lines[last].count("}")
        opened = opened or "{" in lines[last]
        if opened and depth == 0:
            break
    return "\n".join(lines[first:last + 1])


def kernel_markdown(file: str, *names: str) -> str:
    """The Markdown show_kernel displays: the named kernels of a .cu file, or with no names
    the whole file (a short header whose opening comment describes what it defines)."""
    body = "\n\n".join(kernel_source(file, n) for n in names) if names else kernel_path(file).read_text().rstrip()
    return f"`kernels/{file}`\n```cuda\n{body}\n```"


def show_kernel(file: str, *names: str):
    """Display kernels from a .cu file (or the whole file) with CUDA syntax highlighting."""
    display(Markdown(kernel_markdown(file, *names)))


def new_figure(width: float = 7.5, height: float = 4.0, ncols: int = 1):
    """A figure and its axes (a row of ``ncols`` sharing the GB/s axis)."""
    return plt.subplots(1, ncols, figsize=(width, height), layout="constrained", sharey=True)
