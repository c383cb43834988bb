"""The app as a Hugging Face Space runs it, here: is the README's upload a complete app?

    python scripts/space_check.py [--keep DIR]

1. Copies exactly the files the README's upload takes (its ``allow_patterns`` and
   ``ignore_patterns``, matched by huggingface_hub as ``upload_folder`` matches them) of a
   clean checkout (the files git tracks) into an empty folder.
2. Makes a fresh virtual environment there from that folder's requirements.txt alone
   (torch from whatever index pip is set up with: PyTorch's CPU index, which the file
   names, where it can be reached; this machine's own copy where it cannot).
3. Starts that folder's app.py with the environment Spaces sets: SYSTEM=spaces, SPACE_ID,
   GRADIO_SERVER_NAME=0.0.0.0 and server-side rendering on (GRADIO_SSR_MODE=true: Gradio
   then renders the page with Node, which must be on the PATH).
4. Drives it in Debian's headless Chromium (playwright): a Step on the Watch tab, a Score,
   a probe of the Recall tab, each waited for by what the page shows.

Every host but this machine is unresolvable in the browser. In Spaces' mode the page asks
other hosts for some resources: those requests (and the console errors of their failed
loads) are counted apart and named; any other console error fails the check. Prints one
line per stage and exits 0 when the app served every stage with no console error.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_app import free_port, stop_app  # noqa: E402
from bench_browser import CHROMIUM, FLAGS  # noqa: E402

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0"}
# Console errors that follow a failed request to another host, by the host: Gradio's Space
# header asks huggingface.co/api/spaces/<SPACE_ID> for the Space's card and logs this when
# the answer does not come (on Spaces the page sits in huggingface.co's frame, or gets it).
FOLLOWS_OUTSIDE = {"Space not found": "huggingface.co"}
START_TIMEOUT_S = 600  # a loaded 2-core machine: imports, the model, Node's renderer
TIMEOUT_MS = 600_000  # each wait in the browser (a Score's sliding window on busy cores)
# Where pip cannot reach an index that requirements.txt names (PyTorch's, on a machine
# that reaches PyPI alone), it retries 5 times for every package (~8 minutes): ask once.
PIP_RETRIES = "0"


def readme_upload(readme: Path = ROOT / "README.md") -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) of the README's ``upload_folder`` call."""
    text = readme.read_text()
    lists = {}
    for name in ("allow_patterns", "ignore_patterns"):
        found = re.search(rf"{name}=(\[.*?\])", text, re.S)
        if not found:
            raise SystemExit(f"README.md's Spaces section has no {name} list")
        lists[name] = ast.literal_eval(found.group(1))
    return lists["allow_patterns"], lists["ignore_patterns"]


def uploaded_files(checkout: Path = ROOT) -> list[str]:
    """The tracked files the README's upload takes (huggingface_hub's own matching)."""
    from huggingface_hub.utils import filter_repo_objects

    allow, ignore = readme_upload(checkout / "README.md")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=checkout, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(filter_repo_objects(tracked, allow_patterns=allow, ignore_patterns=ignore))


def copy_upload(space: Path, checkout: Path = ROOT) -> list[str]:
    files = uploaded_files(checkout)
    for name in files:
        (space / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkout / name, space / name)
    return files


def make_venv(space: Path) -> Path:
    """A fresh venv in ``space``, with the folder's requirements.txt alone; its python."""
    venv = space / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--retries", PIP_RETRIES]
    result = subprocess.run(
        [*install, "-r", str(space / "requirements.txt")], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"pip install -r requirements.txt failed:\n{result.stderr[-3000:]}")
    return python


def start_space(space: Path, python: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """python app.py in ``space`` as Spaces starts it; (process, url) once it answers."""
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_", "TXL_"))
    }  # the Space's own environment, not this shell's settings
    env.update(
        SYSTEM="spaces",
        SPACE_ID="txl/space-check",
        GRADIO_SERVER_NAME="0.0.0.0",
        GRADIO_SERVER_PORT=str(port),
        GRADIO_SSR_MODE="true",
        PYTHONUNBUFFERED="1",
    )
    out = open(log, "w")  # noqa: SIM115 (the app writes to it until it ends)
    proc = subprocess.Popen([str(python), "app.py"], cwd=space, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the Space's app exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                if response.status == 200 and b"gradio" in response.read().lower():
                    return proc, url
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            stop_app(proc)
            raise SystemExit(f"the Space's app did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.5)


def outside(url: str) -> str | None:
    """The host of a URL that is not this machine's (None for this machine, data: ...)."""
    host = urlparse(url).hostname
    return host if host and host not in LOCAL_HOSTS else None


def drive(url: str) -> dict:
    """A Step, a Score and a probe in Chromium; what the page showed and what it asked."""
    from playwright.sync_api import sync_playwright

    seen = {"errors": [], "outside": set(), "outside_errors": 0}

    def console(message):
        if message.type != "error":
            return
        host = outside(message.location.get("url", "") or "")
        if host:  # a failed load of another host's resource: counted apart
            seen["outside"].add(host)
            seen["outside_errors"] += 1
        else:
            seen["errors"].append(message.text)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", console)
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("request", lambda r: outside(r.url) and seen["outside"].add(outside(r.url)))
            page.goto(url, wait_until="load")
            page.wait_for_selector("#step")
            page.click("#step")
            page.wait_for_selector("#attention [data-position]")
            seen["step"] = int(page.get_attribute("#attention .txl-att", "data-position"))

            page.get_by_role("tab", name="Does memory help?").click()
            page.get_by_text("A quatrain, twice").click()
            page.click("#score_btn")
            done = "Memory vs the sliding"  # the summary's last line: the Score is done
            page.wait_for_function(
                f"document.querySelector('#score_summary').innerText.includes('{done}')"
            )
            page.wait_for_selector("#score_plot .main-svg")
            seen["score"] = page.inner_text("#score_summary").splitlines()[0]

            page.get_by_role("tab", name="How far back can it recall?").click()
            page.click("#recall_btn")
            page.wait_for_function(
                "document.querySelector('#recall_summary')?.innerText.includes('distances read in')"
            )
            page.wait_for_selector("#recall_plot .main-svg")
            seen["recall"] = page.inner_text("#recall_summary").splitlines()[0]
        finally:
            browser.close()
    for error in list(seen["errors"]):
        if FOLLOWS_OUTSIDE.get(error) in seen["outside"]:
            seen["errors"].remove(error)
            seen["outside_errors"] += 1
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="build the Space in this (empty) folder")
    args = parser.parse_args(argv)
    if shutil.which("node") is None:
        raise SystemExit("Node is not on the PATH: Gradio's server-side rendering needs it")
    with tempfile.TemporaryDirectory(prefix="txl-space-") as tmp:
        space = args.keep or Path(tmp) / "space"
        space.mkdir(parents=True, exist_ok=True)
        if any(space.iterdir()):
            raise SystemExit(f"{space} is not empty")
        started = time.perf_counter()
        files = copy_upload(space)
        print(f"upload: {len(files)} files (README.md's allow_patterns) into {space}")
        python = make_venv(space)
        print(f"venv: requirements.txt installed in {time.perf_counter() - started:.0f} s")
        torch_version = subprocess.run(
            [str(python), "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        print(f"torch {torch_version}")
        log = Path(tmp) / "app.log"
        proc, url = start_space(space, python, log)
        print(f"app: serving at {url} (SYSTEM=spaces, GRADIO_SSR_MODE=true)")
        try:
            seen = drive(url)
        finally:
            stop_app(proc)
        # Gradio's banner: "Running on local URL: ..., with SSR ⚡ ..." when Node renders
        seen["ssr"] = "with SSR" in log.read_text()
        print(f"server-side rendering: {'on' if seen['ssr'] else 'OFF'}")
        print(f"step: painted position {seen['step']}")
        print(f"score: {seen['score']}")
        print(f"recall: {seen['recall']}")
        hosts = ", ".join(sorted(seen["outside"])) or "none"
        print(
            f"other hosts asked (unreachable here, counted apart): {hosts}; "
            f"{seen['outside_errors']} console errors from their failed requests"
        )
        print(f"console errors: {len(seen['errors'])}")
        for error in seen["errors"]:
            print(f"  {error}")
        ok = not seen["errors"] and seen["ssr"]
        print("space check: " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
