"""The app's HTTP API without gradio_client: what any other client (curl, JavaScript) may
send, NaN and Infinity included (gradio_client refuses to encode those), and sessions
that are nothing but a session hash (so a test can make hundreds of them cheaply).

    ok, result = call(url, "step", [prompt, memory, mem_len, ...], session_hash="abc")
    # (True, [outputs...]) or (False, "the error message shown to the user")

``data`` lists the endpoint's API parameters in order, without the session's gr.State
(the server fills it in). Two calls with the same session hash share one session.
"""

from __future__ import annotations

import json
import uuid

import httpx


def call(
    url: str,
    api_name: str,
    data: list,
    session_hash: str | None = None,
    client: httpx.Client | None = None,
    timeout: float = 120,
) -> tuple[bool, object]:
    """One event through the queue (POST /gradio_api/call/NAME, then its event stream)."""
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    try:
        body = {"data": data, "session_hash": session_hash or uuid.uuid4().hex}
        # json.dumps writes NaN / Infinity as JavaScript does; strict JSON has no spelling.
        response = client.post(
            f"{url.rstrip('/')}/gradio_api/call/{api_name}",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        if response.status_code != 200:
            return False, f"HTTP {response.status_code}: {response.text}"
        event_id = response.json()["event_id"]
        event = None
        with client.stream(
            "GET", f"{url.rstrip('/')}/gradio_api/call/{api_name}/{event_id}"
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event in ("complete", "error"):
                    payload = json.loads(line.removeprefix("data: "))
                    if event == "complete":
                        return True, payload
                    return False, payload.get("error") if isinstance(payload, dict) else payload
        return False, "the event stream ended without a result"
    finally:
        if own:
            client.close()
