// The "Memory on | off" tab (webapp/tabs/memory_pair.py): the two texts side by side, the
// characters where they differ marked, the parting point with both predictions, and where
// the memory side's last shared character looked (a strip over its keys, the window's edge
// on it). Drawn from the dict webapp/memory_pair_viz.py's pair_view builds. And the tab's
// Play: one stream of pair Steps (the Watch tab's Play, webapp/web/views.js, for this tab's
// buttons). Loaded after views.js, which defines window.TXL.
(function () {
  if (!window.TXL || window.TXL.mountPair) return;

  const { esc, whiteCanvas, FAR_COLOR } = window.TXL;
  const percent = (p) => (p >= 0.1 ? (100 * p).toFixed(0) : p >= 0.001 ? (100 * p).toFixed(1) : (100 * p).toExponential(0)) + " %";
  const tokens = (t) => (typeof t === "string" ? Array.from(t) : t);

  // One side's text: the prompt grey, then the generated tokens, those where the two texts
  // differ marked (the parting one outlined). Runs of one kind are one span.
  function sideHTML(v, text) {
    const pieces = tokens(text), differ = v.differ, parting = v.parting ? v.parting.position : -1;
    const out = [`<span class="txl-pair-prompt">${esc(pieces.slice(0, v.prompt_tokens).join(""))}</span>`];
    let i = v.prompt_tokens;
    for (const [a, b] of differ) {
      if (i < a) out.push(esc(pieces.slice(i, a).join("")));
      for (let k = a; k < b; k++) {
        const cls = k === parting ? "txl-pair-diff txl-pair-parting" : "txl-pair-diff";
        out.push(`<span class="${cls}">${esc(pieces[k] === "\n" ? "↵\n" : pieces[k])}</span>`);
      }
      i = b;
    }
    if (i < pieces.length) out.push(esc(pieces.slice(i).join("")));
    return out.join("");
  }

  function partingHTML(v) {
    if (!v.parting) {
      return `<div class="txl-pair-same">No parting yet: after ${v.steps.toLocaleString()} step${v.steps === 1 ? "" : "s"} the two texts are identical (the same draws chose the same ${esc(v.unit)} on both sides).</div>`;
    }
    const p = v.parting, m = p.with_memory, w = p.without_memory, vis = TXL.visible;
    const list = (top, chosen, cls) => `<div class="txl-pair-top ${cls}">` + top.slice(0, 5).map(([t, q]) =>
      `<span${t === chosen ? ' class="txl-pair-chosen"' : ""}><b>${esc(vis(t))}</b> ${percent(q)}</span>`).join("") + "</div>";
    return `<div class="txl-pair-head">They part at position ${p.position} (step ${p.step + 1}): `
      + `<span class="txl-pair-m">with memory: <b>${esc(vis(m.char))}</b> ${percent(m.p)}</span>; `
      + `<span class="txl-pair-w">without: <b>${esc(vis(w.char))}</b> ${percent(w.p)}</span>`
      + ` <span class="txl-pair-cross">(memory gave '${esc(vis(w.char))}' ${percent(w.p_with_memory)}; the window gave '${esc(vis(m.char))}' ${percent(m.p_without_memory)})</span></div>`
      + `<div class="txl-pair-tops"><span>with memory, top 5:</span>${list(m.top, m.char, "txl-pair-m")}`
      + `<span>without, top 5:</span>${list(w.top, w.char, "txl-pair-w")}</div>`
      + (p.looked ? `<div class="txl-pair-strip-title">Where the memory side's last shared ${esc(v.unit)} '${esc(vis(p.looked.query))}' (position ${p.looked.pos}) looked to predict it, mean over layers and heads: <b>${percent(p.looked.far)}</b> of its attention beyond the window of ${p.looked.window} (left of the blue line), reachable only through memory</div>` : "");
  }

  // The attention strip: one row of cells, viridis(sqrt(weight)), the window's edge.
  function drawStrip(canvas, s) {
    const width = Math.max(240, canvas.parentElement.clientWidth || 600), height = 40;
    const g = whiteCanvas(canvas, width, height);
    const cols = s.w.length, cw = width / Math.max(1, cols);
    for (let c = 0; c < cols; c++) {
      g.fillStyle = TXL.viridis(Math.sqrt(Math.max(0, s.w[c])));
      g.fillRect(Math.floor(c * cw), 2, Math.max(1, Math.ceil((c + 1) * cw) - Math.floor(c * cw)), 20);
    }
    if (s.n_far_cols > 0) {
      const x = s.n_far_cols * cw;
      g.strokeStyle = FAR_COLOR;
      g.lineWidth = 2;
      g.beginPath();
      g.moveTo(x, 0);
      g.lineTo(x, 24);
      g.stroke();
    }
    g.font = "11px ui-sans-serif, system-ui, sans-serif";
    g.fillStyle = "#333";
    g.textBaseline = "top";
    g.textAlign = "left";
    g.fillText(`${s.n_keys} keys ← older`, 0, 27);
    g.textAlign = "right";
    g.fillText("newer →", width, 27);
    if (s.n_far_cols > 0) {
      g.fillStyle = FAR_COLOR;
      g.textAlign = "center";
      g.fillText(`│ window of ${s.window}`, Math.min(width - 60, Math.max(60, s.n_far_cols * cw)), 27);
    }
  }

  function mountPair(element, props, watch) {
    const root = element.querySelector(".txl-pair");
    const sides = root.querySelectorAll(".txl-pair-side");
    const part = root.querySelector(".txl-pair-part");
    const canvas = root.querySelector(".txl-pair-strip");
    const tip = root.querySelector(".txl-tip");
    let v = null;
    function render() {
      v = TXL.unpack(props.value);
      v = v && v.memory_text != null ? v : null;
      if (!v) {
        for (const side of sides) {
          side.querySelector(".txl-pair-title").textContent = "";
          side.querySelector(".txl-pair-text").innerHTML = "";
        }
        part.innerHTML = '<span class="txl-hint">(nothing yet: Step, Play or Generate: both sides write from the prompt with the same draws)</span>';
        canvas.style.display = "none";
        root.dataset.steps = "0";
        root.dataset.parting = "";
        root.dataset.differ = "0";
        document.dispatchEvent(new CustomEvent("txl-pair-painted", { detail: { steps: 0 } }));
        return;
      }
      const titles = [
        v.memory ? `With memory: ${v.mem_len} ${v.unit}s of Transformer-XL memory` : "Memory off (both sides the window)",
        `Without memory: the window of ${v.window} ${v.unit}s, recomputed each step`,
      ];
      [v.memory_text, v.window_text].forEach((text, i) => {
        sides[i].querySelector(".txl-pair-title").textContent = titles[i];
        const body = sides[i].querySelector(".txl-pair-text");
        body.innerHTML = sideHTML(v, text);
        body.scrollTop = body.scrollHeight;
      });
      part.innerHTML = partingHTML(v);
      const strip = v.parting && v.parting.looked;
      canvas.style.display = strip ? "block" : "none";
      if (strip) drawStrip(canvas, strip);
      tip.style.display = "none";
      // What is on screen, for tests and tools.
      root.dataset.steps = String(v.steps);
      root.dataset.parting = v.parting ? String(v.parting.position) : "";
      root.dataset.differ = String(v.counts.differ);
      document.dispatchEvent(new CustomEvent("txl-pair-painted", { detail: { steps: v.steps } }));
    }
    new ResizeObserver(() => {
      const strip = v && v.parting && v.parting.looked;
      if (strip) drawStrip(canvas, strip);
    }).observe(root);
    watch("value", TXL.painter(render));
    render();
  }

  // ---- Play: the Watch tab's stream for this tab's buttons (TXL.makePlay, views.js) --
  // Step, Generate and Reset clicked while Play streams wait until it has ended, so that
  // their answer comes after its last message.
  const play = TXL.makePlay({
    button: "pair_play",
    run: "pair_play_run",
    stop: "pair_play_stop",
    stoppers: ["pair_step", "pair_generate", "pair_reset"],
  });

  Object.assign(window.TXL, {
    mountPair,
    pairTogglePlay: play.togglePlay,
    pairPlayEnded: play.playEnded,
    pairWithPlayId: play.withPlayId,
  });
})();
