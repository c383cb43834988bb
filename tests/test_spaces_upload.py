"""The README's upload to Spaces takes every file the app needs to run (that the upload is
a complete app, served as Spaces serves it: tests/test_space_check.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts.space_check import uploaded_files

ROOT = Path(__file__).resolve().parents[1]
# What app.py runs on: its own modules, the page's scripts and styles, the tabs and their
# data, the bundled weights.
APP_FILES = ("app.py", "requirements.txt", "txl/", "webapp/", "weights/shakespeare-char/")


def test_readme_upload_takes_every_file_the_app_runs_on():
    tracked = subprocess.run(
        ["git", "ls-files", *APP_FILES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "webapp/web/views.js" in tracked and "webapp/tabs/recall.py" in tracked
    needed = [f for f in tracked if not f.endswith((".md", ".png", "log.jsonl"))]
    # huggingface_hub's own matching, as upload_folder applies the README's patterns
    assert sorted(set(needed) - set(uploaded_files())) == []
