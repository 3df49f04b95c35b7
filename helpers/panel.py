"""The widget panel: knobs on the left, a live bandwidth plot on the right.

Introduced in chapter 1 and reused by every chapter. Each knob (pack size,
block size, dtype, ...) is a dropdown; the size slider sets the largest input
of the sweep. Every change re-runs the sweep with the new setting, adding
points to the plot as they are measured, with the copy ceiling and the vendor
baseline beside them. Without a GPU the panel moves over the recorded
configurations only, and says so.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output, display
from tqdm.auto import tqdm

from .display import new_figure, plot_bandwidth, size_label
from .errors import BookError, DeviceOutOfMemoryError


class Panel:
    def __init__(self, bench, *, provider: str, knobs: dict, sizes: list, measure,
                 baselines: dict = None, title: str = "", size_text=size_label,
                 ylabel: str = "GB/s (bytes read + written)", x: str = "size", xlabel: str = "input size"):
        """``knobs``: {name: options}; ``sizes``: what ``measure`` takes (bytes or
        elements), shown on the slider by ``size_text``; ``measure(config, size)`` -> Row;
        ``baselines``: {label: fn(config, size) -> Row}."""
        self.bench, self.provider, self.measure, self.ylabel = bench, provider, measure, ylabel
        self.x, self.xlabel = x, xlabel  # the plot's x axis: see display.plot_bandwidth
        self.baselines, self.title, self.sizes = baselines or {}, title, sorted(sizes)
        self.cache = {}  # (label, config, size) -> Row: a setting seen before is not re-measured
        self.controls = {name: widgets.Dropdown(options=self._options(name, options), description=name,
                                                style={"description_width": "initial"})
                         for name, options in knobs.items()}
        self.size = widgets.SelectionSlider(options=[(size_text(s), s) for s in self.sizes],
                                            value=self.sizes[-1], description="up to",
                                            continuous_update=False)
        self.progress, self.plot = widgets.Output(), widgets.Output()
        for control in (*self.controls.values(), self.size):
            control.observe(lambda _: self.update(), names="value")
        note = widgets.HTML(f"<i>{'Measuring live' if bench.live else 'Replay: recorded configurations only'}"
                            f" — {bench.label}</i>")
        self.widget = widgets.VBox([widgets.HBox([*self.controls.values(), self.size]), note,
                                    self.progress, self.plot])

    def _options(self, name, options):
        """Without a GPU, only the values that were recorded can be shown."""
        if self.bench.live:
            return list(options)
        recorded = {c.get(name) for c in self.bench.recorded_configs(self.provider)}
        recorded |= {r.dtype for r in self.bench.rows(self.provider)} if name == "dtype" else set()
        kept = [o for o in options if o in recorded]
        return kept or list(options)

    @property
    def config(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _row(self, label, fn, config, size):
        key = (label, tuple(sorted(config.items())), size)
        if key not in self.cache:
            self.cache[key] = fn(config, size)
        return self.cache[key]

    def update(self):
        config, sizes = self.config, [s for s in self.sizes if s <= self.size.value]
        ours, baselines = [], {label: [] for label in self.baselines}
        name = ", ".join(f"{k}={v}" for k, v in config.items())
        with self.progress:
            clear_output()
            bar = tqdm(total=len(sizes), desc=f"{self.provider} {name}", leave=False)
        try:
            for size in sizes:
                ours.append(self._row(self.provider, self.measure, config, size))
                for label, fn in self.baselines.items():
                    baselines[label].append(self._row(label, fn, config, size))
                bar.update()
                self._draw({f"{self.provider} ({name})": ours}, baselines)
        except BookError as e:  # e.g. a configuration that was not recorded
            with self.plot:
                clear_output(wait=True)
                print(f"{type(e).__name__}: {e}")
        finally:
            bar.close()

    def _draw(self, series, baselines):
        fig, ax = new_figure()
        plot_bandwidth(ax, series, ceiling_gbs=self.bench.copy_gbs, label=self.bench.label,
                       baselines=baselines, ylabel=self.ylabel, x=self.x, xlabel=self.xlabel)
        if self.title:
            ax.set_title(self.title, loc="left", fontsize=10)
        with self.plot:
            clear_output(wait=True)
            display(fig)
        plt.close(fig)

    def sweep_all(self, knobs: dict = None):
        """Measure every combination of the knobs at every size (with a GPU), so the
        replay can later move over all of them. Combinations a kernel cannot take
        are skipped. Without a GPU, says how many combinations were recorded."""
        import itertools
        knobs = knobs or {name: list(c.options) for name, c in self.controls.items()}
        combos = [dict(zip(knobs, values)) for values in itertools.product(*knobs.values())]
        if not self.bench.live:
            print(f"Replay: {len(self.bench.recorded_configs(self.provider))} configurations of "
                  f"{self.provider} recorded ({self.bench.label}).")
            return
        skipped = []
        for config in tqdm(combos, desc=f"all {len(combos)} settings of the panel"):
            try:
                for size in self.sizes:
                    self._row(self.provider, self.measure, config, size)
            except DeviceOutOfMemoryError as e:  # larger settings would fail too: stop here
                print(f"Sweep stopped at {config}: {e}\nThe {len(self.cache)} measurements taken so far "
                      "are kept; bench.save() records them.")
                return
            except BookError as e:
                skipped.append(f"{config}: {e}")
        print(f"Measured {len(combos) - len(skipped)} settings at {len(self.sizes)} sizes; "
              f"skipped {len(skipped)} that the kernel cannot take.")

    def show(self):
        display(self.widget)
        self.update()
