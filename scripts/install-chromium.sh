#!/usr/bin/env bash
# Debian's chromium for the browser tests and benchmarks (Playwright drives it; never
# `playwright install`, which downloads a browser). Quiet when chromium is already there;
# installs it with apt-get when this shell may (root, or sudo without a password);
# otherwise stops at once and says what to run. CHROMIUM=path names another browser.
set -euo pipefail

browser="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$browser" ] || command -v chromium >/dev/null 2>&1; then
  exit 0
fi

if [ "$(id -u)" = 0 ]; then
  as_root=()
elif sudo -n true >/dev/null 2>&1; then
  as_root=(sudo -n)
else
  echo "chromium is missing (needed by the browser tests). Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y chromium" >&2
  echo "or set CHROMIUM=/path/to/chromium." >&2
  exit 1
fi

echo "Installing Debian's chromium (apt-get, about a minute)..."
# env: sudo would drop DEBIAN_FRONTEND, and noninteractive keeps debconf from asking.
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
if ! command -v chromium >/dev/null 2>&1; then
  echo "apt-get install chromium finished, but there is still no chromium on PATH" >&2
  exit 1
fi
