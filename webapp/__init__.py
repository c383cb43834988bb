"""The demo's machinery: everything that exists only for the page, on top of the txl package.

- ``serve``: the model cache, the sessions, input checks, and every handler's logic.
- ``budget``, ``offload``: the server-wide memory budget, and offload of idle memories to disk.
- ``longwork``: long work (the Score, the recall probe) paced beside visitors' Steps.
- ``viz``, ``anatomy_viz``, ``recall_viz``: per-step views, Plotly charts, matplotlib figures.
- ``web/``: the page's JS and CSS; ``tabs/``: one module per tab, its layout and wiring.

``app.py`` at the top of the repository builds the page from these. Imports run one way:
app.py -> webapp -> txl; nothing in txl imports this package.
"""
