// What memory changes: the next-token prediction with memory and without, as two aligned
// bar lists (rank by rank, one scale), the sampled token marked in both, and in words
// under them. Drawn from the dict webapp/watch_viz.py's predictions_view builds (the API's
// summary["predictions"] plus the position). Loaded into the page's <head> after views.js,
// which defines window.TXL; the guard keeps a second injection from redefining it.
(function () {
  if (!window.TXL || window.TXL.mountPredictions) return;

  const { esc, visible } = window.TXL;
  const percent = (p) => (p >= 0.1 ? (100 * p).toFixed(0) : p >= 0.001 ? (100 * p).toFixed(1) : (100 * p).toExponential(0)) + "%";
  const times = (r) => (r >= 10 ? r.toFixed(0) : r.toFixed(1)) + "×";

  // One column of bars: [token, p] rows, most likely first; the step's token marked, and
  // added under the list when it is not among them. kind: "with" (memory's blue) or
  // "without" (amber: the model on its window alone, as memory off is).
  function column(rows, chosen, pChosen, scale, title, kind) {
    const out = [`<div class="txl-pred-col txl-pred-${kind}"><div class="txl-pred-title">${title}</div>`];
    let seen = false;
    const row = (token, p, extra) => {
      const mine = token === chosen;
      seen = seen || mine;
      const width = Math.max(0.5, (100 * p) / scale).toFixed(1);
      return `<div class="txl-pred-row${mine ? " txl-pred-chosen" : ""}${extra}" data-token="${esc(token)}" title="'${esc(visible(token))}': p = ${p.toPrecision(4)}">`
        + `<span class="txl-pred-tok">${esc(visible(token))}</span>`
        + `<span class="txl-pred-bar"><span style="width:${width}%"></span></span>`
        + `<span class="txl-pred-p">${percent(p)}</span></div>`;
    };
    for (const [token, p] of rows) out.push(row(token, p, ""));
    if (!seen) out.push(row(chosen, pChosen, " txl-pred-extra"));
    out.push("</div>");
    return out.join("");
  }

  function words(v) {
    const c = `'${esc(visible(v.chosen))}'`;
    const pw = v.p_chosen.with_memory, po = v.p_chosen.without_memory;
    if (v.without_memory == null)
      return `Memory is off: the model sees only the last ${v.window} ${esc(v.unit)}s. It gave ${c} ${percent(pw)}.`;
    const bits = v.bits_saved, ratio = Math.pow(2, Math.abs(bits));
    let effect;
    if (Math.abs(bits) < 0.05) effect = `memory changed little for ${c}`;
    else if (bits > 0) effect = `memory made ${c} <b>${times(ratio)} likelier</b> here`;
    else effect = `memory made ${c} <b>${times(ratio)} less likely</b> here`;
    return `${effect}: ${percent(pw)} with memory, ${percent(po)} without`
      + ` (<b>${bits >= 0 ? "saved" : "cost"} ${Math.abs(bits).toFixed(2)} bits</b>).`
      + ` KL(with ‖ without) = ${v.kl_bits.toFixed(3)} bits.`;
  }

  function mountPredictions(element, props, watch) {
    const root = element.querySelector(".txl-pred");
    const body = root.querySelector(".txl-pred-body");
    const empty = root.querySelector(".txl-empty");
    function render() {
      let v = TXL.unpack(props.value);
      v = v && v.with_memory ? v : null;
      empty.style.display = v ? "none" : "block";
      if (!v) {
        body.innerHTML = "";
        delete root.dataset.position;
        return;
      }
      // One scale for both lists, so that bars compare across them.
      const all = v.with_memory.concat(v.without_memory || []);
      const scale = Math.max(...all.map((r) => r[1]), 1e-9);
      const back = v.history && v.history[0] ? ` · ${v.history[0]} steps ago` : "";
      const cols = [v.memory
        ? column(v.with_memory, v.chosen, v.p_chosen.with_memory, scale, "with memory", "with")
        : column(v.with_memory, v.chosen, v.p_chosen.with_memory, scale,
          `memory off (last ${v.window} ${esc(v.unit)}s)`, "without")];
      if (v.without_memory)
        cols.push(column(v.without_memory, v.chosen, v.p_chosen.without_memory, scale,
          `without memory (last ${v.window} ${esc(v.unit)}s)`, "without"));
      // The step's token: sampled, or given (the text's own next one: an example's, Watch it's)
      const mark = `<span class="txl-pred-mark">${esc(visible(v.chosen))}</span>`;
      const took = v.given ? `written: the text's own next ${esc(v.unit)} ${mark} (not sampled)` : `sampled ${mark}`;
      body.innerHTML = `<div class="txl-pred-head">next ${esc(v.unit)} at position ${v.pos}${back}: the top ${v.with_memory.length}; ${took}</div>`
        + `<div class="txl-pred-cols">${cols.join("")}</div>`
        + `<div class="txl-pred-words">${words(v)}</div>`;
      root.dataset.given = v.given ? "true" : "false";
      root.dataset.position = String(v.pos);
      root.dataset.bitsSaved = v.bits_saved == null ? "" : String(v.bits_saved);
    }
    watch("value", TXL.painter(render));
    render();
  }

  window.TXL.mountPredictions = mountPredictions;
})();
