"""The demo's machinery: everything that exists only for the page, on top of the txl package.

- ``serve``: the service the tabs share (``DemoService``): the model cache, the visitors,
  the memory budget and the long work, and what every handler does around a Session.
- ``visitors``: each visitor's state (``VisitorState``), their registry and expiry.
- ``inputs``: the one check of what a visitor sends.
- ``budget``, ``offload``: the server-wide memory budget, and offload of idle memories to
  disk (what a session holds, in bytes).
- ``longwork``: long work (the Score, the recall probe) paced beside visitors' Steps.
- ``watch_viz``, ``score_viz``, ``recall_viz``, ``anatomy_viz``: each tab's views, from
  plain numbers; ``figures``: what they share.
- ``tabs/``: one module per tab, its layout, handlers and wiring; ``web/``: the page's JS
  and CSS.

``app.py`` at the top of the repository composes the page from these (docs/architecture.md
is the map). Imports run one way: app.py -> webapp.tabs -> webapp -> txl; nothing in txl
imports this package.
"""
