// The per-step views of txl's app, drawn in the browser from the small dicts that
// webapp/watch_viz.py builds (attention_view, text_view), and Play, one stream of steps
// from the server. Loaded once into the page's <head> by app.py (launch(head=...)); each
// view's js_on_load calls TXL.mountAttention / TXL.mountText with Gradio's element,
// props and watch. Plotly drew the same heatmap in ~400 ms of script per step; a canvas
// takes a few milliseconds.
(function () {
  if (window.TXL) return;

  // Viridis at 9 stops, interpolated: colour = viridis(sqrt(weight)), so that the small
  // weights that most keys get stay visible (the colour bar is labelled in weights).
  const VIRIDIS = [
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
  ];
  function viridis(t) {
    t = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(t)), f = t - i;
    const a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return `rgb(${(a[0] + (b[0] - a[0]) * f) | 0},${(a[1] + (b[1] - a[1]) * f) | 0},${(a[2] + (b[2] - a[2]) * f) | 0})`;
  }
  const TICKS = [0, 0.01, 0.1, 0.25, 0.5, 1];
  const FAR_COLOR = "#1d4ed8"; // beyond the window: what only memory reaches
  const VISIBLE = { "\n": "↵", " ": "␣", "\t": "⇥", "\r": "␍" };
  const visible = (s) => (s.length === 1 ? VISIBLE[s] || s : s.trim() || s);
  const pct = (x) => (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%";
  const weight = (x) => (x >= 0.01 ? x.toFixed(3) : x.toExponential(1));
  // Text for innerHTML, quotes too: a token (a word model's '"', say) goes into attributes.
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");

  // A 2-D context on ``canvas`` for width x height CSS pixels at the screen's density, the
  // canvas cleared to opaque white (a PNG of it reads on any background). ``shown`` is the
  // element the page sizes: the canvas, or the <img> a canvas off the page is copied into.
  function whiteCanvas(canvas, width, height, shown = canvas) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    shown.style.width = width + "px";
    shown.style.height = height + "px";
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = "#ffffff";
    g.fillRect(0, 0, width, height);
    return g;
  }

  // A view's value as its dict: the page's Step sends it packed as one JSON string
  // (webapp/figures.py packed: Gradio copies each number of a value apart, several times per
  // Step), other events and older pages the dict itself. The last string read is kept:
  // the attention view and its terms read the same value.
  let lastPacked = null, lastView = null;
  function unpack(value) {
    if (!value || typeof value !== "object") return null;
    if (typeof value.packed !== "string") return value;
    if (value.packed !== lastPacked) (lastView = JSON.parse(value.packed)), (lastPacked = value.packed);
    return lastView;
  }

  // A view's redraw on a new value: at once, or while Play streams once per frame, with
  // the newest value (messages that come faster than the page paints are skipped; the
  // text and the step history keep every step).
  function painter(render) {
    let queued = false;
    return () => {
      if (!plays.some((play) => play.streams)) return render();
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => {
        queued = false;
        render();
      });
    };
  }

  // Tell whoever waits (Play, the tests, benchmarks) that a step's view is on screen.
  function painted(root, pos) {
    root.dataset.position = String(pos);
    document.dispatchEvent(new CustomEvent("txl-painted", { detail: { position: pos } }));
  }

  // ---- attention of the newest token: rows x key columns on a canvas -----------------

  const M = { left: 92, right: 58, top: 30, bottom: 44, row: 22 };

  function layout(v, width) {
    const cols = v.labels.length;
    const plotW = Math.max(40, width - M.left - M.right);
    return { cols, plotW, cw: plotW / Math.max(1, cols), height: M.top + v.rows.length * M.row + M.bottom };
  }

  function drawAttention(canvas, v) {
    const width = Math.max(280, canvas.parentElement.clientWidth || 600);
    const L = layout(v, width);
    const g = whiteCanvas(canvas, width, L.height);
    g.font = "12px ui-sans-serif, system-ui, sans-serif";
    g.textBaseline = "middle";
    // Cells. Columns are at least a pixel wide; neighbours share a pixel when narrower.
    for (let r = 0; r < v.rows.length; r++) {
      const y = M.top + r * M.row, row = v.w[r];
      for (let c = 0; c < L.cols; c++) {
        g.fillStyle = viridis(Math.sqrt(Math.max(0, row[c])));
        const x = M.left + c * L.cw;
        g.fillRect(Math.floor(x), y, Math.max(1, Math.ceil(x + L.cw) - Math.floor(x)), M.row - 2);
      }
      g.fillStyle = "#222";
      g.textAlign = "right";
      g.fillText(v.rows[r], M.left - 6, y + (M.row - 2) / 2);
      // With memory: the row's share of attention beyond the window (what only memory
      // gave it) as a bar and a number on the right; its share on all of memory (the
      // window's memory too) as a lighter bar behind it, seen where the two differ. The
      // number has a white halo, so that it reads over its own dark bar. Memory off,
      // nothing lies beyond the window: no bars.
      if (!v.memory) continue;
      const mx = M.left + L.plotW + 6, bw = M.right - 10;
      const far = v.far ? v.far[r] : 0, mem = v.mass[r];
      g.fillStyle = "rgba(148,163,184,0.22)";
      g.fillRect(mx, y + 3, bw, M.row - 8);
      g.fillStyle = "rgba(59,130,246,0.3)";
      g.fillRect(mx, y + 3, bw * Math.max(mem, far), M.row - 8);
      g.fillStyle = FAR_COLOR;
      g.fillRect(mx, y + 3, bw * far, M.row - 8);
      g.textAlign = "left";
      g.lineWidth = 3;
      g.strokeStyle = "#fff";
      g.strokeText(pct(far), mx + 3, y + (M.row - 2) / 2);
      g.fillStyle = "#111";
      g.fillText(pct(far), mx + 3, y + (M.row - 2) / 2);
    }
    // Title, the window's edge and the memory | current boundary, the column labels (when
    // they fit), the colour bar.
    g.textAlign = "left";
    g.fillStyle = "#111";
    const back = v.history && v.history[0] ? ` · ${v.history[0]} steps ago` : "";
    const title = `newest ${v.unit} '${v.query}' (position ${v.pos})${back} attends to:`;
    g.fillText(title, 4, 10);
    // The bars' heading, right of the title when there is room.
    const heading = "beyond the window", titleW = g.measureText(title).width;
    g.font = "10px ui-sans-serif, system-ui, sans-serif";
    if (v.memory && 4 + titleW + 12 + g.measureText(heading).width < width) {
      g.textAlign = "right";
      g.fillStyle = "#555";
      g.fillText(heading, width - 2, 10);
    }
    g.font = "12px ui-sans-serif, system-ui, sans-serif";
    const bottom = M.top + v.rows.length * M.row;
    // The window's edge: keys left of it are `window` or more back, out of reach of a
    // model without memory (solid blue); memory | current (dashed red). Each edge is
    // labelled on both sides ("older ◀ │ ▶ newer"), unless that runs into a label
    // already drawn or off the canvas (the view's help and the hover say it too).
    const taken = [];
    const label = (older, newer, x, color) => {
      const a = x - 4 - g.measureText(older).width, b = x + 4 + g.measureText(newer).width;
      if (a < 0 || b > width || taken.some(([c, d]) => a < d + 8 && c < b + 8)) return;
      taken.push([a, b]);
      g.fillStyle = color;
      g.textAlign = "right";
      g.fillText(older, x - 4, M.top - 10);
      g.textAlign = "left";
      g.fillText(newer, x + 4, M.top - 10);
    };
    const edge = (x, color, dash) => {
      g.strokeStyle = color;
      g.lineWidth = 2;
      g.setLineDash(dash);
      g.beginPath();
      g.moveTo(x, M.top - 6);
      g.lineTo(x, bottom);
      g.stroke();
      g.setLineDash([]);
    };
    const farCols = v.n_far_cols || 0;
    const xw = M.left + farCols * L.cw, xm = M.left + v.n_mem_cols * L.cw;
    const memoryEdge = v.memory && v.n_mem_cols > 0 && v.n_mem_cols < L.cols;
    if (memoryEdge) edge(xm, "#ef4444", [5, 3]);
    if (farCols > 0) {
      edge(xw, FAR_COLOR, []);
      label("only memory ◀", `▶ window of ${v.window}`, xw, FAR_COLOR);
    }
    if (memoryEdge) label("memory ◀", "▶ current", xm, "#ef4444");
    g.fillStyle = "#333";
    g.textAlign = "center";
    if (L.cw >= 9) {
      for (let c = 0; c < L.cols; c++) g.fillText(v.labels[c].slice(0, 2), M.left + (c + 0.5) * L.cw, bottom + 9);
    } else {
      g.textAlign = "left";
      g.fillText(`${v.n_keys} keys ← older`, M.left, bottom + 9);
      g.textAlign = "right";
      g.fillText("newer →", M.left + L.plotW, bottom + 9);
    }
    const barW = Math.min(220, L.plotW), bx = M.left, by = bottom + 22;
    for (let i = 0; i < barW; i++) {
      g.fillStyle = viridis(i / (barW - 1));
      g.fillRect(bx + i, by, 1.5, 8);
    }
    g.fillStyle = "#333";
    g.font = "10px ui-sans-serif, system-ui, sans-serif";
    g.textAlign = "center";
    for (const t of TICKS) g.fillText(String(t), bx + Math.sqrt(t) * (barW - 1), by + 15);
    g.textAlign = "left";
    g.fillText("weight", bx + barW + 8, by + 4);
    return L;
  }

  function mountAttention(element, props, watch) {
    const root = element.querySelector(".txl-att");
    const canvas = root.querySelector("canvas");
    const tip = root.querySelector(".txl-tip");
    const empty = root.querySelector(".txl-empty");
    let v = null, L = null;
    function render() {
      v = unpack(props.value);
      v = v && v.w ? v : null;
      canvas.style.display = v ? "block" : "none";
      empty.style.display = v ? "none" : "block";
      tip.style.display = "none";
      if (!v) {
        delete root.dataset.position;
        return;
      }
      L = drawAttention(canvas, v);
      // What was drawn, for tests and tools: columns, and how many of them are memory.
      root.dataset.columns = String(L.cols);
      root.dataset.memoryColumns = String(v.memory ? v.n_mem_cols : 0);
      root.dataset.windowColumns = String(v.n_far_cols || 0); // beyond the window's edge
      painted(root, v.pos);
    }
    canvas.addEventListener("mousemove", (e) => {
      if (!v) return;
      const box = canvas.getBoundingClientRect();
      const x = e.clientX - box.left, y = e.clientY - box.top;
      const c = Math.floor((x - M.left) / L.cw), r = Math.floor((y - M.top) / M.row);
      if (c < 0 || c >= L.cols || r < 0 || r >= v.rows.length) {
        tip.style.display = "none";
        return;
      }
      const a = v.first[c], b = v.last[c];
      const side = c < (v.n_far_cols || 0) ? "memory, beyond the window"
        : v.memory && c < v.n_mem_cols ? "memory, in the window" : "current";
      const keys = a === b ? `key '${v.labels[c]}' at ${a}, ${v.pos - a} back`
        : `keys ${a}–${b} '${v.labels[c]}', ${v.pos - b}–${v.pos - a} back`;
      tip.textContent = `${v.rows[r]} · query '${v.query}' (${v.pos}) → ${keys} (${side}) · weight ${weight(v.w[r][c])}`;
      tip.style.display = "block";
      tip.style.left = Math.min(x + 12, box.width - 260) + "px";
      tip.style.top = y + 14 + "px";
    });
    canvas.addEventListener("mouseleave", () => (tip.style.display = "none"));
    root.querySelector(".txl-png").addEventListener("click", () => {
      if (!v) return;
      const a = document.createElement("a");
      a.href = canvas.toDataURL("image/png");
      a.download = `attention-pos${v.pos}.png`;
      a.click();
    });
    new ResizeObserver(() => v && (L = drawAttention(canvas, v))).observe(root);
    watch("value", painter(render));
    render();
  }

  // ---- the text, shaded by the newest token's attention ------------------------------
  //
  // or, in the second mode ("memory's effect"), each token produced with memory on shaded
  // by the bits memory saved on it: log2 p_with - log2 p_without, from v.effect (surprisals
  // in centibits). Blue: memory made the token likelier; red: less likely; white: no change.

  const shade = { mode: "attention" }; // the page's choice, kept across redraws
  function effectAt(v, i) {
    const e = v.effect;
    if (!e || i < e.start || i >= e.start + e.with.length || e.with[i - e.start] == null) return null;
    const w = e.with[i - e.start], o = e.without[i - e.start];
    return { bits: (o - w) / 100, pWith: Math.pow(2, -w / 100), pWithout: Math.pow(2, -o / 100) };
  }
  function effectColor(bits) {
    const a = (0.85 * Math.min(1, Math.abs(bits) / 4)).toFixed(3); // saturates at 4 bits
    return bits >= 0 ? `rgba(37,99,235,${a})` : `rgba(220,38,38,${a})`;
  }
  // The hover's words for a token shaded by memory's effect (here and in the Score tab).
  function effectTip(what, e, without = "without") {
    return `${what} · p with memory ${e.pWith.toPrecision(3)}, ${without} ${e.pWithout.toPrecision(3)} · memory ${e.bits >= 0 ? "saved" : "cost"} ${Math.abs(e.bits).toFixed(2)} bits`;
  }

  function mountText(element, props, watch) {
    const root = element.querySelector(".txl-textview");
    const body = root.querySelector(".txl-text");
    const legend = root.querySelector(".txl-legend");
    const tip = root.querySelector(".txl-tip");
    let v = null, toggled = false;
    function render() {
      v = unpack(props.value);
      v = v && v.runs ? v : null;
      tip.style.display = "none";
      if (!v) {
        body.innerHTML = '<span class="txl-hint">(no text yet: type a prompt, then Step, Play or Generate)</span>';
        legend.innerHTML = "";
        delete root.dataset.position;
        return;
      }
      const roles = v.memory ? ["gone", "far", "memory", "current", "newest"] : ["gone", "current", "newest"];
      const effect = shade.mode === "effect";
      root.dataset.shade = shade.mode;
      const toggle = `<span class="txl-shade">${[["attention", "attention"], ["effect", "memory's effect"]]
        .map(([m, label]) => `<button type="button" data-shade="${m}"${shade.mode === m ? ' class="txl-on"' : ""}>${label}</button>`).join("")}</span>`;
      legend.innerHTML = roles.map((r) => `<span class="txl-r-${r}">${esc(v.labels[r])}</span>`).join(" ")
        + ` shade by ${toggle}`
        + (effect ? ` <span class="txl-effect-key">memory hurt ← bits saved → memory helped (±4 bits; the prompt is not shaded: it was read, not predicted one by one)</span>`
          : v.w ? ` <span class="txl-heat-key">shade: attention of the newest ${esc(v.unit)} (${esc(v.layer)}, ${esc(v.head)})</span>` : "");
      const out = [];
      if (v.earlier) out.push(`<span class="txl-r-gone">[… ${v.earlier.toLocaleString()} earlier ${esc(v.unit)}s]\n</span>`);
      // The window's edge: a mark before its first character (the run that starts there).
      const edgeAt = v.window_start == null ? -1 : v.window_start;
      for (const [role, start, run] of v.runs) {
        const mark = start === edgeAt ? " txl-win" : "";
        // A string run is one span, unless memory's effect shades its characters: a
        // character model's string is its tokens (a word model's effect runs are lists).
        const split = typeof run === "string" && effect && v.effect && v.unit === "character"
          && start + run.length > v.effect.start;
        if (typeof run === "string" && !split) {
          out.push(`<span class="txl-r-${role}${mark}">${esc(run)}</span>`);
          continue;
        }
        const text = split ? Array.from(run) : run;
        let plain = ""; // tokens with no shade in this mode: one span for all of them
        for (let k = 0; k < text.length; k++) {
          const i = start + k;
          let t = text[k], style = "", data = "";
          if (role === "newest" && (t === "\n" || t === " ")) t = t === "\n" ? "↵\n" : "␣";
          if (effect) {
            const e = effectAt(v, i);
            if (e && role !== "newest") style = ` style="background-color:${effectColor(e.bits)}"`;
            if (e) data = ` data-bits="${e.bits.toFixed(2)}"`;
          } else if (v.w && i >= v.w0 && i < v.w0 + v.w.length) {
            // Background alpha ~ sqrt(weight): the colour scale of the attention view.
            const w = v.w[i - v.w0];
            if (role !== "newest") style = ` style="background-color:rgba(124,58,237,${(0.06 + 0.9 * Math.sqrt(w)).toFixed(3)})"`;
            data = " data-w";
          }
          const first = k === 0 ? mark : "";
          if (!data && role !== "newest" && !first) {
            plain += t;
            continue;
          }
          if (plain) out.push(`<span class="txl-r-${role}">${esc(plain)}</span>`), (plain = "");
          out.push(`<span class="txl-r-${role}${first} txl-k" data-i="${i}"${data}${style}>${esc(t)}</span>`);
        }
        if (plain) out.push(`<span class="txl-r-${role}">${esc(plain)}</span>`);
      }
      body.innerHTML = out.join("");
      if (toggled) return; // the same step, shaded anew: no new paint for Play to wait on
      body.scrollTop = body.scrollHeight; // the newest character in view, under the legend
      if (v.pos >= 0) painted(root, v.pos);
      else delete root.dataset.position;
    }
    body.addEventListener("mouseover", (e) => {
      const span = e.target.closest(".txl-k");
      if (!v || !span) return;
      const i = Number(span.dataset.i), ef = effectAt(v, i);
      const box = root.getBoundingClientRect(), s = span.getBoundingClientRect();
      const what = `'${visible(span.textContent.replace("↵\n", "\n"))}' at ${i}`;
      if (shade.mode === "effect" && ef)
        tip.textContent = effectTip(what, ef);
      else if (v.w && i >= v.w0 && i < v.w0 + v.w.length)
        tip.textContent = `${what} · ${v.pos - i} back · weight ${weight(v.w[i - v.w0])}`;
      else return;
      tip.style.display = "block";
      tip.style.left = Math.min(s.left - box.left, box.width - 240) + "px";
      tip.style.top = s.bottom - box.top + 4 + "px";
    });
    body.addEventListener("mouseleave", () => (tip.style.display = "none"));
    legend.addEventListener("click", (e) => {
      const button = e.target.closest("button[data-shade]");
      if (!button || button.dataset.shade === shade.mode) return;
      shade.mode = button.dataset.shade;
      toggled = true;
      render();
      toggled = false;
    });
    watch("value", painter(render));
    render();
  }

  // ---- Play: one stream of steps from the server (webapp/tabs/watch_play.py) -------
  //
  // Play clicks the hidden #play_run: one server event that steps the session and sends
  // the newest step's views every few frames, painted by the views' own watch() as they
  // come; the steps between are in the text and the step history. Pause clicks the hidden
  // #play_stop, which stops the stream before its next step; the stream then sends the
  // views of its last step and ends. The page numbers its Plays (playId: both events
  // send it), so that a Pause stops the Play before it even when that Play is still queued.

  // A Play: its buttons by id (``button`` the page shows, ``run`` and ``stop`` the hidden
  // triggers of its stream and of Pause; ``stoppers``, the buttons that stop it), and its
  // state. on: the user wants Play; streams: Play events not yet ended. The button's
  // data-loop says "running" until every stream has ended and its last views are
  // painted, then "stopped", so that a test (or a user script) can wait for the session
  // to be still. The Watch tab's Play below; the "Memory on | off" tab makes its own
  // (webapp/web/pair.js).
  const plays = [];
  function makePlay({ button, run, stop, stoppers }) {
    const play = { on: false, id: 0, streams: 0 };
    plays.push(play);
    const shown = () => document.querySelector(`#${button}`);
    function setPlaying(on) {
      play.on = on;
      const b = shown();
      if (b) {
        b.textContent = on ? "Pause" : "Play";
        b.classList.toggle("txl-playing", on);
      }
    }
    function setRunning() {
      const b = shown();
      if (b) b.dataset.loop = play.streams > 0 ? "running" : "stopped";
    }
    function togglePlay() {
      if (play.on) return stopPlay();
      const trigger = document.querySelector(`#${run}`);
      if (!trigger) return;
      play.id += 1;
      play.streams += 1;
      setPlaying(true);
      setRunning();
      trigger.click();
    }
    function stopPlay() {
      setPlaying(false);
      document.querySelector(`#${stop}`)?.click();
    }
    // A Play event ended (paused, stopped by an error such as the text cap, or by another
    // event): "stopped" once its last views are on screen (painter draws them at the next
    // frame; the frame after it has them).
    function playEnded() {
      play.streams = Math.max(0, play.streams - 1);
      if (play.streams === 0) setPlaying(false);
      requestAnimationFrame(() =>
        requestAnimationFrame(() => {
          setRunning();
          if (!play.streams) afterPlay.splice(0).forEach((click) => click());
        }),
      );
    }
    // The Play number the run and stop triggers send (their js: the first input replaced).
    const withPlayId = (...inputs) => [play.id, ...inputs.slice(1)];
    // The stoppers stop Play. The click waits until the stream has ended (its last views
    // painted), then goes on: so its answer comes after the stream's last message, never
    // before it.
    const afterPlay = [];
    document.addEventListener(
      "click",
      (e) => {
        const b = e.target.closest && e.target.closest("button");
        if (!play.streams || !b || !stoppers.includes(b.id)) return;
        e.stopPropagation();
        e.preventDefault();
        if (play.on) stopPlay();
        afterPlay.push(() => b.click());
      },
      true,
    );
    return { togglePlay, playEnded, withPlayId };
  }
  // Reset, Load, Generate and Continue stop the Watch tab's Play; so does a Step clicked
  // by hand.
  const { togglePlay, playEnded, withPlayId } = makePlay({
    button: "play",
    run: "play_run",
    stop: "play_stop",
    stoppers: ["reset", "load", "generate", "continue", "step"],
  });

  window.TXL = { unpack, painter, makePlay, mountAttention, mountText, togglePlay, playEnded, withPlayId, viridis, effectAt, effectColor, effectTip, visible, esc, whiteCanvas, FAR_COLOR };
})();
