"""The README's upload as a Space runs it (scripts/space_check.py): the uploaded files alone
in an empty folder, a fresh venv from their requirements.txt, app.py with Spaces'
environment (SYSTEM=spaces, SPACE_ID, GRADIO_SERVER_NAME=0.0.0.0, server-side rendering
on), and a Step, a Score and a probe in Chromium with no console error. Minutes: a venv
with torch and Gradio is installed from scratch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser


@pytest.mark.timeout(1800)
def test_the_readme_upload_builds_and_serves_as_a_space(tmp_path):
    space = tmp_path / "space"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "space_check.py"), "--keep", str(space)],
        capture_output=True,
        text=True,
        timeout=1700,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "space check: passed" in out and "console errors: 0" in out
    assert "server-side rendering: on" in out
    # the upload alone: no test, benchmark or doc came along
    assert (space / "app.py").exists() and (space / "weights/shakespeare-char").is_dir()
    assert not (space / "tests").exists() and not (space / "benchmarks").exists()
    assert "torch 2.13.0+cpu" in out  # the CPU build
    assert "step: painted position" in out and "recall: " in out
