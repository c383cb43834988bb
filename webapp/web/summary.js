// The last step's summary and the status line.
//
// The summary (the API's step summary dict, packed by the page's Step: webapp/figures.py packed)
// as indented JSON, written only while it can be seen: in its accordion, open now or when
// it opens. Loaded after views.js, which defines window.TXL.
(function () {
  if (!window.TXL || window.TXL.mountSummary) return;

  function mountSummary(element, props, watch) {
    const pre = element.querySelector(".txl-summary");
    let shown; // the value whose text is in the page (undefined: none yet)
    function render() {
      const value = props.value;
      if (value === shown || !pre.checkVisibility()) return; // hidden: drawn when it opens
      shown = value;
      const v = TXL.unpack(value);
      pre.textContent = v ? JSON.stringify(v, null, 2) : "(nothing yet: Step or Generate)";
    }
    // Opening the accordion gives the <pre> a size: draw the newest value then.
    new ResizeObserver(render).observe(pre);
    watch("value", render);
    render();
  }

  // The status line: watch_viz.status_markdown's one line, whose only markup is **bold**. Gradio's
  // Markdown component parsed and sanitised it anew on every Step; this writes it directly.
  function mountStatus(element, props, watch) {
    const line = element.querySelector(".txl-status");
    function render() {
      const md = typeof props.value === "string" ? props.value : "";
      line.innerHTML = TXL.esc(md).replace(/\*\*(.+?)\*\*/g, "<b>$1</b>");
    }
    watch("value", render);
    render();
  }

  window.TXL.mountSummary = mountSummary;
  window.TXL.mountStatus = mountStatus;
})();
