"""The page's tabs, one module each: its layout (``build() -> dict`` of components), its
handlers (the methods the events call) and the wiring of its events (``wire(ui, state)``),
on the one ``DemoService`` (webapp/serve.py) that app.py builds and hands to every tab.

- ``watch``: "Watch the memory" (with ``watch_views``, what it shows of a session, and
  ``watch_examples``, the passages above its prompt);
- ``score``: "Does memory help?"; ``recall``: "How far back can it recall?";
  ``anatomy``: "Inside the attention"; ``memory_pair``: "Memory on | off";
- ``examples``: the example texts the tabs offer (plain data).

A tab's views come from its own view module in webapp/ (``watch_viz``, ``score_viz``,
``recall_viz``, ``anatomy_viz``, ``memory_pair_viz``); the model's work from txl/. A tab may
reach another tab's components through ``ui`` (Watch it lands on the Watch tab) but imports
no other tab, except ``watch_views``, the Watch tab's outputs, which Watch it returns (and
``watch_play``'s Play control, which ``memory_pair``'s Play shares).
"""
