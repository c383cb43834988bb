// The four terms of the relative attention score, as strips under the attention view.
// With one layer and one head chosen, webapp/watch_viz.py's attention view carries that head's
// terms for the newest token (webapp/anatomy_viz.py step_terms): (a) q·k, (b) q·W_R R(i−j),
// (c) u·k, (d) v·W_R R(i−j). Drawn over the same key columns as the view above, with the
// scaled sum and its softmax (= the attention row). Loaded after views.js (app.py), it adds
// TXL.mountTerms, called by the attention view's js_on_load after TXL.mountAttention.
(function () {
  if (!window.TXL || window.TXL.mountTerms) return;

  // The attention view's left and right margins (views.js M), so that the columns line up.
  const M = { left: 92, right: 58, top: 4, row: 15, gap: 3, legend: 42 };
  const NAMES = ["a", "b", "c", "d"];
  const LABELS = ["(a) q·k", "(b) q·W R", "(c) u·k", "(d) v·W R", "scale·Σ", "weight"];
  const fmt = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 1 ? x.toFixed(2) : x.toFixed(3));
  const weight = (x) => (x >= 0.01 ? x.toFixed(3) : x.toExponential(1));

  // Blue (below the strip's mean) - white - red (above), t in [-1, 1].
  function diverging(t) {
    t = Math.max(-1, Math.min(1, t));
    const w = 1 - Math.abs(t), c = t < 0 ? [37, 99, 235] : [220, 38, 38];
    return `rgb(${c.map((x) => Math.round(255 * w + x * (1 - w))).join(",")})`;
  }

  // Each strip scaled (the units the softmax sees) and centred on its mean over the keys
  // (adding a constant to a query's scores changes no weight); the weights = softmax(sum).
  function prepare(t) {
    const K = t.key_positions.length, s = t.scale;
    const raw = NAMES.map((n) => t[n]);
    const sum = t.key_positions.map((_, k) => s * (raw[0][k] + raw[1][k] + raw[2][k] + raw[3][k]));
    const top = sum.reduce((a, b) => Math.max(a, b), -Infinity);
    const e = sum.map((x) => Math.exp(x - top)), z = e.reduce((a, b) => a + b, 0);
    const scaled = raw.map((r) => r.map((x) => s * x)).concat([sum]);
    const centred = scaled.map((r) => {
      const mean = r.reduce((a, b) => a + b, 0) / K;
      return r.map((x) => x - mean);
    });
    let S = 0;
    for (const r of centred) for (const x of r) S = Math.max(S, Math.abs(x));
    return { raw, sum, weights: e.map((x) => x / z), centred, S: S || 1 };
  }

  // [x0, x1) of each key inside the attention view's columns (a bucket's keys share it).
  function keySpans(v, t, plotW) {
    const cols = v.labels.length, cw = plotW / Math.max(1, cols);
    let c = 0;
    return t.key_positions.map((p) => {
      while (c < cols - 1 && p > v.last[c]) c++;
      const n = v.last[c] - v.first[c] + 1, f = (p - v.first[c]) / n;
      return [M.left + (c + f) * cw, M.left + (c + f + 1 / n) * cw];
    });
  }

  // Drawn on a canvas that is not in the page and shown as an <img>: the attention view's
  // canvas stays the only one in #attention (tests and tools address it so).
  function draw(canvas, img, v, P, width) {
    const plotW = Math.max(40, width - M.left - M.right);
    const bottom = M.top + LABELS.length * (M.row + M.gap);
    const height = bottom + M.legend;
    const g = window.TXL.whiteCanvas(canvas, width, height, img);
    g.font = "11px ui-sans-serif, system-ui, sans-serif";
    g.textBaseline = "middle";
    const spans = keySpans(v, v.terms, plotW);
    for (let r = 0; r < LABELS.length; r++) {
      const y = M.top + r * (M.row + M.gap);
      for (let k = 0; k < spans.length; k++) {
        const [x0, x1] = spans[k];
        g.fillStyle = r < 5 ? diverging(P.centred[r][k] / P.S) : TXL.viridis(Math.sqrt(P.weights[k]));
        g.fillRect(Math.floor(x0), y, Math.max(1, Math.ceil(x1) - Math.floor(x0)), M.row);
      }
      g.fillStyle = "#222";
      g.textAlign = "right";
      g.fillText(LABELS[r], M.left - 6, y + M.row / 2);
    }
    // The shared diverging scale: −S ... 0 ... +S (each strip minus its mean).
    const barW = Math.min(220, plotW), by = bottom + 4;
    for (let i = 0; i < barW; i++) {
      g.fillStyle = diverging((2 * i) / (barW - 1) - 1);
      g.fillRect(M.left + i, by, 1.5, 8);
    }
    g.fillStyle = "#333";
    g.font = "10px ui-sans-serif, system-ui, sans-serif";
    g.textAlign = "center";
    g.fillText(`−${fmt(P.S)}`, M.left, by + 16);
    g.fillText("0", M.left + barW / 2, by + 16);
    g.fillText(`+${fmt(P.S)}`, M.left + barW, by + 16);
    g.textAlign = "left";
    g.fillText("each strip: scale × term minus its mean over the keys; one colour scale for all five", M.left, by + 30);
    img.src = canvas.toDataURL("image/png");
    return { spans };
  }

  // Why there are no strips: no single head chosen, a past step, or a step without terms.
  function note(v) {
    const single = v.rows.length === 1 && /^L\d+ head \d+$/.test(v.rows[0]);
    if (!single)
      return "Choose one layer and one head to see the four terms of its score: (a) content q·k, "
        + "(b) content-dependent position q·W_R R(i−j), (c) global content bias u·k, (d) global position bias v·W_R R(i−j).";
    if (v.history && v.history[0] > 0)
      return "The four terms are kept for the newest step only (the history keeps each step's "
        + "attention, a quarter of their size): slide back to 0 to see them.";
    return "This step kept no terms: Step again (a Step keeps them when one layer and one "
      + "head are chosen, Generate for its last token).";
  }

  function mountTerms(element, props, watch) {
    const root = element.querySelector(".txl-terms");
    if (!root) return;
    root.innerHTML = '<div class="txl-terms-words"></div><img class="txl-terms-strips" alt="the four terms of the chosen head, per key"><div class="txl-terms-tip"></div>';
    const words = root.querySelector(".txl-terms-words");
    const img = root.querySelector("img");
    const canvas = document.createElement("canvas");
    const tip = root.querySelector(".txl-terms-tip");
    const width = () => Math.max(280, root.clientWidth || 600);
    let v = null, P = null, L = null;
    let drawnWidth = 0; // the ResizeObserver redraws on a change of width only
    function render() {
      v = TXL.unpack(props.value);
      v = v && v.w ? v : null;
      tip.style.display = "none";
      root.style.display = v ? "block" : "none";
      if (!v || !v.terms) {
        img.style.display = "none";
        words.textContent = v ? note(v) : "";
        delete root.dataset.position;
        return;
      }
      P = prepare(v.terms);
      img.style.display = "block";
      L = draw(canvas, img, v, P, (drawnWidth = width()));
      words.textContent = v.terms.words;
      root.dataset.position = String(v.pos);
      root.dataset.keys = String(v.terms.key_positions.length);
      document.dispatchEvent(new CustomEvent("txl-terms-painted", { detail: { position: v.pos } }));
    }
    img.addEventListener("mousemove", (e) => {
      if (!v || !v.terms || !L) return;
      const box = img.getBoundingClientRect();
      const x = e.clientX - box.left, y = e.clientY - box.top;
      let lo = 0, hi = L.spans.length - 1; // the last key starting left of x
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (L.spans[mid][0] <= x) lo = mid;
        else hi = mid - 1;
      }
      const k = lo, t = v.terms;
      if (x < M.left || x >= L.spans[k][1] + 1 || y > M.top + LABELS.length * (M.row + M.gap)) {
        tip.style.display = "none";
        return;
      }
      const p = t.key_positions[k];
      tip.textContent = `key at ${p}, ${v.pos - p} back · (a) ${fmt(t.a[k])} · (b) ${fmt(t.b[k])} · `
        + `(c) ${fmt(t.c[k])} · (d) ${fmt(t.d[k])} · scale·Σ ${fmt(P.sum[k])} · weight ${weight(P.weights[k])}`;
      tip.style.display = "block";
      tip.style.left = Math.min(x + 12, box.width - 300) + "px";
      tip.style.top = img.offsetTop + y + 14 + "px";
    });
    img.addEventListener("mouseleave", () => (tip.style.display = "none"));
    new ResizeObserver(() => {
      if (v && v.terms && width() !== drawnWidth) L = draw(canvas, img, v, P, (drawnWidth = width()));
    }).observe(root);
    watch("value", TXL.painter(render));
    render();
  }

  window.TXL.mountTerms = mountTerms;
})();
