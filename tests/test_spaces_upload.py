"""The README's upload to Spaces takes every file the app needs to run."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from huggingface_hub.utils import filter_repo_objects

ROOT = Path(__file__).resolve().parents[1]
# What app.py runs on: its own modules, the page's scripts and styles, the tabs and their
# data, the bundled weights.
APP_FILES = ("app.py", "requirements.txt", "txl/", "webapp/", "weights/shakespeare-char/")


def readme_allow_patterns() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"allow_patterns=(\[.*?\])", readme, re.S)
    assert found, "README's Spaces section has no allow_patterns list"
    return ast.literal_eval(found.group(1))


def test_readme_upload_takes_every_file_the_app_runs_on():
    tracked = subprocess.run(
        ["git", "ls-files", *APP_FILES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "webapp/web/views.js" in tracked and "webapp/tabs/recall.py" in tracked
    needed = [f for f in tracked if not f.endswith((".md", ".png", "log.jsonl"))]
    # huggingface_hub's own matching, as upload_folder applies it
    taken = set(filter_repo_objects(needed, allow_patterns=readme_allow_patterns()))
    assert sorted(set(needed) - taken) == []
