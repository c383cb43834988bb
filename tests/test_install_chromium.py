"""scripts/install-chromium.sh, run with a PATH of stub commands (id, sudo, apt-get) that
record how they were called: nothing is installed for real."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-chromium.sh"
BASH = shutil.which("bash") or "/bin/bash"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path):
    """A PATH with only stubs (and env, which the script runs apt-get through); the
    calls land in calls.log. `uid` and `sudo_ok` choose who the script runs as."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    log.touch()
    os.symlink(shutil.which("env"), bin_dir / "env")

    def run(uid: int = 1000, sudo_ok: bool = False, chromium: bool = False):
        stub(bin_dir, "id", f'[ "$1" = -u ] && echo {uid}')
        # sudo -n runs the command when it may, else fails as with a password needed.
        run_it = 'shift; "$@"' if sudo_ok else "exit 1"
        stub(bin_dir, "sudo", f'echo "sudo $*" >> {log}; [ "$1" = -n ] && {run_it}')
        # `apt-get install` puts a chromium on PATH, as Debian's package does.
        stub(
            bin_dir,
            "apt-get",
            f'echo "apt-get $* DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> {log}\n'
            f'[ "$1" = install ] && printf "#!{BASH}\\n" > {bin_dir}/chromium'
            f" && chmod +x {bin_dir}/chromium; true",
        )
        if chromium:
            stub(bin_dir, "chromium", "true")
        env = {"PATH": str(bin_dir), "CHROMIUM": str(tmp_path / "no-such-chromium")}
        result = subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True)
        return result, log.read_text().splitlines()

    return run


def test_quiet_and_nothing_installed_when_chromium_is_on_path(machine):
    result, calls = machine(uid=0, chromium=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == result.stderr == ""
    assert calls == []


def test_quiet_when_chromium_is_at_the_chromium_path(machine, tmp_path):
    browser = tmp_path / "my-chromium"
    stub(tmp_path, "my-chromium", "true")
    env = {"PATH": os.environ["PATH"], "CHROMIUM": str(browser)}
    result = subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_without_root_or_sudo_stops_and_names_the_command(machine):
    result, calls = machine(uid=1000, sudo_ok=False)
    assert result.returncode != 0
    assert "sudo apt-get install -y chromium" in result.stderr
    assert not [c for c in calls if c.startswith("apt-get")]  # stopped before any apt-get


def test_as_root_runs_apt_get_update_then_install(machine):
    result, calls = machine(uid=0)
    assert result.returncode == 0, result.stderr
    assert calls == [
        "apt-get update -qq DEBIAN_FRONTEND=noninteractive",
        "apt-get install -y -qq chromium DEBIAN_FRONTEND=noninteractive",
    ]
    again, calls_again = machine(uid=0)  # idempotent: now present, nothing more runs
    assert again.returncode == 0 and again.stdout == "" and calls_again == calls


def test_with_passwordless_sudo_installs_through_sudo(machine):
    result, calls = machine(uid=1000, sudo_ok=True)
    assert result.returncode == 0, result.stderr
    apt_calls = [c for c in calls if c.startswith("apt-get")]
    assert [c.split()[1] for c in apt_calls] == ["update", "install"]
    assert "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -qq" in calls
