// Where memory mattered (the Score tab): the scored text shaded by the bits memory saved
// over the sliding window on each character, on the diverging scale and with the hover of
// the Watch tab's "memory's effect" (views.js: TXL.effectAt, effectColor, effectTip), and
// the list of the characters where it saved the most, each in its context. Drawn from the
// dict webapp/score_viz.py's moments_view builds. Loaded into the page's <head> after views.js.
(function () {
  if (!window.TXL || window.TXL.mountMoments) return;
  const { effectAt, effectColor, effectTip, visible, esc } = window.TXL;
  const bits = (x) => x.toFixed(2);
  // A context on one line: newlines shown as ↵.
  const oneLine = (s) => esc(s).replace(/\n/g, "↵ ");

  function mountMoments(element, props, watch) {
    const root = element.querySelector(".txl-moments");
    const head = root.querySelector(".txl-mom-head");
    const body = root.querySelector(".txl-mom-text");
    const list = root.querySelector(".txl-mom-list");
    const empty = root.querySelector(".txl-empty");
    const tip = root.querySelector(".txl-tip");
    let v = null, tokens = [];

    function render() {
      v = props.value && typeof props.value === "object" && props.value.effect ? props.value : null;
      tip.style.display = "none";
      empty.style.display = v ? "none" : "block";
      if (!v) {
        head.innerHTML = body.innerHTML = list.innerHTML = "";
        delete root.dataset.moments;
        return;
      }
      // A character model's text comes as one string: its characters are its tokens.
      tokens = typeof v.text === "string" ? Array.from(v.text) : v.text;
      const rank = new Map(v.moments.map((m, r) => [m.position, r + 1]));
      const out = [];
      for (let i = 0; i < tokens.length; i++) {
        const e = effectAt(v, i), r = rank.get(i);
        const style = e ? ` style="background-color:${effectColor(e.bits)}"` : "";
        const data = e ? ` data-bits="${e.bits.toFixed(2)}"` : "";
        const moment = r ? ` txl-moment" data-rank="${r}` : "";
        // A moment on a newline or a space is drawn visible (↵, ␣), as the Watch tab's
        // newest token: an outline around nothing would not show.
        const t = tokens[i], shown = r && t === "\n" ? "↵\n" : r && t === " " ? "␣" : t;
        out.push(`<span class="txl-k${moment}" data-i="${i}"${data}${style}>${esc(shown)}</span>`);
      }
      body.innerHTML = out.join("");
      const unit = esc(v.unit), n = v.effect.with.length;
      head.innerHTML = `Memory (segments of ${v.window} + memory of ${v.mem_len}) against the sliding `
        + `window of ${v.window}, ${unit} by ${unit}: it saved <b>${bits(v.bits_saved)} bits</b> over `
        + `${n.toLocaleString()} ${unit}s (${(v.bits_saved / Math.max(1, n)).toFixed(3)} per ${unit}). `
        + `<span class="txl-effect-key">memory hurt ← bits saved → memory helped (±4 bits)</span>`;
      list.dataset.title = `The ${v.moments.length} ${unit}s memory saved the most bits on `
        + `(click one to find it in the text; Watch it below):`;
      list.innerHTML = v.moments.map((m, r) => {
        // The moment in its context: v.context tokens either side (m.context, as text).
        const p = m.position, a = Math.max(0, p - v.context), b = p + 1 + v.context;
        const before = tokens.slice(a, p).join(""), after = tokens.slice(p + 1, b).join("");
        return `<li data-position="${p}" data-rank="${r + 1}"><span class="txl-mom-ctx">`
          + `${a > 0 ? "…" : ""}${oneLine(before)}<mark>${esc(visible(m.char))}</mark>`
          + `${oneLine(after)}${b < tokens.length ? "…" : ""}</span>`
          + `<span class="txl-mom-bits">'${esc(visible(m.char))}' at ${m.position.toLocaleString()}: `
          + `${bits(m.bits_window)} bits through the window, ${bits(m.bits_memory)} with memory: `
          + `<b>saved ${bits(m.bits_saved)}</b></span></li>`;
      }).join("");
      root.dataset.moments = v.moments.map((m) => m.position).join(",");
    }

    body.addEventListener("mouseover", (event) => {
      const span = event.target.closest(".txl-k");
      if (!v || !span) return;
      const i = Number(span.dataset.i), e = effectAt(v, i);
      if (!e) return (tip.style.display = "none");
      const r = span.dataset.rank ? ` · moment ${span.dataset.rank}` : "";
      tip.textContent = effectTip(`'${visible(tokens[i])}' at ${i}`, e, "through the window") + r;
      const box = root.getBoundingClientRect(), s = span.getBoundingClientRect();
      tip.style.display = "block";
      tip.style.left = Math.min(s.left - box.left, box.width - 240) + "px";
      tip.style.top = s.bottom - box.top + 4 + "px";
    });
    body.addEventListener("mouseleave", () => (tip.style.display = "none"));
    // A moment of the list: show it in the text.
    list.addEventListener("click", (event) => {
      const item = event.target.closest("li[data-position]");
      const span = item && body.querySelector(`[data-i="${item.dataset.position}"]`);
      if (!span) return;
      span.scrollIntoView({ block: "center", behavior: "smooth" });
      span.classList.remove("txl-flash");
      void span.offsetWidth; // restart the animation
      span.classList.add("txl-flash");
    });
    watch("value", render);
    render();
  }

  window.TXL.mountMoments = mountMoments;
})();
