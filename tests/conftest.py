"""Shared fixtures. ``peer_python`` provides the reference implementation's interpreter."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
import torch

# The tests use tiny models: with several threads the synchronisation costs more than
# the arithmetic (100x slower on a busy 2-core machine), so one thread is faster.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` run without PYTHONPATH=. still finds txl
    sys.path.insert(0, str(ROOT))



def pytest_addoption(parser):
    parser.addoption(
        "--reverse",
        action="store_true",
        help="run the collected tests in reverse order: a test that needs another's "
        "leftover state (or breaks a later one) fails one way round",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--reverse"):
        items.reverse()


PEER_VENV = ROOT / ".venv-peer"
# Outside the repository, so it never shows up in git status.
PEER_LOCK = Path(tempfile.gettempdir()) / f"txl-venv-peer-{zlib.crc32(bytes(ROOT)):08x}.lock"
# transformers deleted TransfoXL in v5; 4.38-4.57 crash on the first forward (issue 29650).
# sacremoses: the reference word tokenizer (TransfoXLTokenizer) needs it.
PEER_REQUIREMENTS = ["torch==2.13.0", "transformers==4.37.2", "sacremoses==0.2.0"]
# Reads the installed version without importing transformers (which takes seconds).
PEER_CHECK = (
    "import importlib.metadata as m; m.version('torch'); m.version('sacremoses'); "
    "print(m.version('transformers'))"
)


def _check_peer(python: str) -> None:
    if not Path(python).exists():
        pytest.fail(f"no reference interpreter at {python} (TXL_PEER_PYTHON?)", pytrace=False)
    result = subprocess.run(
        [python, "-W", "ignore", "-c", PEER_CHECK], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        pytest.fail(
            f"the reference interpreter {python} lacks one of {PEER_REQUIREMENTS}:\n"
            f"{result.stderr[-2000:]}\nfix or delete {PEER_VENV} (or set TXL_PEER_PYTHON)",
            pytrace=False,
        )
    if result.stdout.strip() != "4.37.2":
        pytest.fail(
            f"{python} has transformers {result.stdout.strip()}, the tests need 4.37.2",
            pytrace=False,
        )


def _create_peer_venv() -> str:
    """python -m venv + pip install (~25 s with a warm pip cache)."""
    python = PEER_VENV / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(PEER_VENV)],
        [str(python), "-m", "pip", "install", "--quiet", *PEER_REQUIREMENTS],
    ]
    for cmd in steps:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            pytest.fail(
                f"creating the reference venv failed: {' '.join(cmd)}\n{result.stderr[-3000:]}",
                pytrace=False,
            )
    return str(python)


@pytest.fixture(scope="session")
def peer_python() -> str:
    """Path of a python that has transformers 4.37.2 (the reference TransfoXL).

    TXL_PEER_PYTHON overrides; otherwise <repo>/.venv-peer, created when missing. A missing
    reference is a failure, never a skip: the equivalence tests are the point.
    """
    python = os.environ.get("TXL_PEER_PYTHON")
    if python is None:
        python = str(PEER_VENV / "bin" / "python")
        # One creator at a time (pytest-xdist workers, parallel runs); the rest wait.
        with open(PEER_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not Path(python).exists():
                python = _create_peer_venv()
    _check_peer(python)
    return python
