// The bandwidth explorer of the published book: pick a kernel, a dtype and its
// configuration, and the chart shows the recorded GB/s against size, with the copy
// ceiling and PyTorch from the same run. Reads window.BOOK_DATA[chapter], written
// by book/_ext/bandwidth_explorer.py from book/data/<chapter>.json. No libraries.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];

  function dataUrl(chapter) {
    const me = Array.from(document.scripts).find((s) => /explorer\.js/.test(s.src));
    return me.src.replace(/explorer\.js.*$/, `data/${chapter}.js`);
  }

  function load(chapter) {
    return new Promise((resolve, reject) => {
      if (window.BOOK_DATA && window.BOOK_DATA[chapter]) return resolve(window.BOOK_DATA[chapter]);
      const script = document.createElement("script");
      script.src = dataUrl(chapter);
      script.onload = () => resolve(window.BOOK_DATA[chapter]);
      script.onerror = () => reject(new Error(`no recorded data for ${chapter}`));
      document.head.appendChild(script);
    });
  }

  // Bytes of the input: its shape times its element size (row.bytes counts every byte
  // moved, which is twice that for a copy and once for a sum).
  const ITEM = {float64: 8, float32: 4, int32: 4, uint32: 4, float16: 2, bfloat16: 2, uint8: 1};
  const sizeOf = (row) => row.shape.reduce((a, b) => a * b, 1) * (ITEM[row.dtype] || 1);
  const label = (bytes) => {
    for (const [unit, scale] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (bytes >= scale) return `${+(bytes / scale).toFixed(1)} ${unit}`;
    }
    return `${bytes} B`;
  };
  const value = (row, key) => (key === "dtype" ? row.dtype : row.config[key]);

  function el(tag, attrs, parent) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function draw(svg, series, ceiling, caption) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = 760, H = 360, L = 60, R = 20, T = 24, B = 44;
    const rows = series.flatMap((s) => s.rows);
    const xs = rows.map((r) => Math.log2(sizeOf(r)));
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    const yMax = ceiling * 1.15;
    const at = (size) => L + ((Math.log2(size) - x0) / (x1 - x0)) * (W - L - R);
    const px = (r) => at(sizeOf(r));
    const py = (gbs) => H - B - (gbs / yMax) * (H - T - B);
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#333"}, svg);
    el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#333"}, svg);
    for (let g = 0; g <= yMax; g += 1000) {
      el("line", {x1: L, y1: py(g), x2: W - R, y2: py(g), stroke: "#eee"}, svg);
      el("text", {x: L - 6, y: py(g) + 4, "text-anchor": "end", "font-size": 11}, svg).textContent = g;
    }
    const ticks = [...new Set(rows.map(sizeOf))].sort((a, b) => a - b);
    const step = Math.ceil(ticks.length / 7);
    ticks.filter((_, i) => i % step === 0).forEach((t) => {
      el("text", {x: at(t), y: H - B + 16, "text-anchor": "middle", "font-size": 11}, svg).textContent = label(t);
    });
    el("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "font-size": 12}, svg).textContent = "input size";
    el("text", {x: 14, y: (T + H - B) / 2, "font-size": 12, transform: `rotate(-90 14 ${(T + H - B) / 2})`,
                "text-anchor": "middle"}, svg).textContent = "GB/s (bytes moved)";
    el("line", {x1: L, y1: py(ceiling), x2: W - R, y2: py(ceiling), stroke: "crimson", "stroke-dasharray": "3 3"}, svg);
    el("text", {x: W - R, y: py(ceiling) - 4, "text-anchor": "end", "font-size": 11, fill: "crimson"}, svg)
      .textContent = `copy ceiling ${Math.round(ceiling)} GB/s`;
    series.forEach((s, i) => {
      const points = s.rows.map((r) => `${px(r)},${py(r.gbs)}`).join(" ");
      const color = s.baseline ? "#555" : COLORS[i % COLORS.length];
      el("polyline", {points, fill: "none", stroke: color, "stroke-width": 2,
                      "stroke-dasharray": s.baseline ? "6 4" : "none", class: "series"}, svg);
      s.rows.forEach((r) => {
        const dot = el("circle", {cx: px(r), cy: py(r.gbs), r: 3, fill: color}, svg);
        el("title", {}, dot).textContent = `${s.name}: ${label(sizeOf(r))}, ${Math.round(r.gbs)} GB/s, ${(r.ms * 1e3).toFixed(1)} µs`;
      });
      el("text", {x: L + 10, y: T + 14 * (i + 1), "font-size": 11, fill: color}, svg).textContent = s.name;
    });
    el("text", {x: W - R, y: 14, "text-anchor": "end", "font-size": 11, fill: "#555"}, svg).textContent = caption;
  }

  async function explorer(root) {
    const data = await load(root.dataset.chapter);
    const providers = root.dataset.providers.split(",");
    const keys = root.dataset.keys.split(",");
    const baselines = (root.dataset.baselines || "").split(",").filter(Boolean);
    const fixed = JSON.parse(root.dataset.fixed || "{}");
    // Rows timed in turns with their peers (a head-to-head table) repeat rows timed alone.
    const oneD = data.rows.filter((r) => r.shape.length === 1 && r.config.l2_flush !== false &&
                                         r.config.in_turns_with === undefined);
    const matches = (r, wanted) => Object.entries(wanted).every(([k, v]) => String(value(r, k)) === String(v));
    const ours = oneD.filter((r) => providers.includes(r.provider) && matches(r, fixed));

    const controls = document.createElement("div");
    controls.className = "controls";
    const selects = {};
    const add = (name, options) => {
      const wrap = document.createElement("label");
      wrap.textContent = name;
      const select = document.createElement("select");
      select.name = name;
      options.forEach((o) => select.add(new Option(o, o)));
      wrap.appendChild(select);
      controls.appendChild(wrap);
      selects[name] = select;
      select.addEventListener("change", update);
    };
    add("kernel", providers.filter((p) => ours.some((r) => r.provider === p)));
    keys.forEach((k) => add(k, [...new Set(ours.map((r) => value(r, k)).filter((v) => v !== undefined))]
      .sort((a, b) => (a > b ? 1 : -1))));
    // Start on, and move between, combinations that were recorded: after a change,
    // the other controls snap to the recorded combination with the most sizes.
    const combos = new Map();
    ours.forEach((r) => {
      const key = JSON.stringify([r.provider, ...keys.map((k) => String(value(r, k)))]);
      combos.set(key, (combos.get(key) || 0) + 1);
    });
    function snap(changed) {
      let best = null, bestCount = -1;
      for (const [key, count] of combos) {
        const [provider, ...values] = JSON.parse(key);
        const fits = changed === undefined ||
          (changed === "kernel" ? provider === selects.kernel.value
                                : provider === selects.kernel.value && values[keys.indexOf(changed)] === selects[changed].value);
        if (fits && count > bestCount) { best = [provider, ...values]; bestCount = count; }
      }
      if (!best) return;
      selects.kernel.value = best[0];
      keys.forEach((k, i) => { selects[k].value = best[i + 1]; });
    }
    Object.entries(selects).forEach(([name, select]) => {
      select.removeEventListener("change", update);
      select.addEventListener("change", () => { snap(name); update(); });
    });
    snap();
    const preferred = JSON.parse(root.dataset.default || "{}");  // the chapter's best kernel first
    if (Object.keys(preferred).length) {
      const key = JSON.stringify([preferred.kernel, ...keys.map((k) => String(preferred[k]))]);
      if (combos.has(key)) {
        selects.kernel.value = preferred.kernel;
        keys.forEach((k) => { selects[k].value = String(preferred[k]); });
      }
    }
    const svg = el("svg", {viewBox: "0 0 760 360", role: "img"});
    const note = document.createElement("p");
    note.className = "note";
    root.append(controls, svg, note);
    const caption = `recorded on ${data.device} on ${data.recorded}`;

    function update() {
      const wanted = {};
      keys.forEach((k) => { wanted[k] = selects[k].value; });
      const mine = ours.filter((r) => r.provider === selects.kernel.value && keys.every(
        (k) => value(r, k) === undefined || String(value(r, k)) === wanted[k]));
      const bySize = new Map();
      mine.forEach((r) => bySize.set(sizeOf(r), r));  // one row per size
      const series = [{name: `${selects.kernel.value} (${keys.map((k) => `${k} ${wanted[k]}`).join(", ")})`,
                       rows: [...bySize.values()].sort((a, b) => sizeOf(a) - sizeOf(b))}];
      const dtype = wanted.dtype;
      baselines.forEach((b) => {
        const rows = oneD.filter((r) => r.provider === b && (!dtype || r.dtype === dtype))
          .sort((a, c) => sizeOf(a) - sizeOf(c));
        if (rows.length) series.push({name: b, rows, baseline: true});
      });
      if (!series[0].rows.length) {
        note.textContent = "This combination was not recorded; pick another.";
      } else {
        note.textContent = `${series[0].rows.length} sizes; hover a point for its time. ${caption}.`;
      }
      draw(svg, series.filter((s) => s.rows.length), data.copy_gbs, caption);
      root.dataset.drawn = String(Number(root.dataset.drawn || 0) + 1);
    }
    update();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll(".bandwidth-explorer").forEach((root) => {
      explorer(root).catch((e) => { root.textContent = `Explorer: ${e.message}`; });
    });
  });
})();
