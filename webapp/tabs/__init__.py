"""The app's tabs beyond "Watch the memory": each module builds one tab's layout and wires
its events (``build(app) -> dict`` of components, ``wire(app, ui, state)``), so that app.py
stays a page of layout. Logic lives in txl/ (the model) and webapp/serve.py (the handlers);
these modules only lay out and call it."""
