#!/usr/bin/env bash
# Headless Chromium for the dashboard tests (tests/http/test_dashboard.py).
#
#   bash scripts/browser.sh install   # idempotent: apt-get installs chromium when missing
#   bash scripts/browser.sh check     # print the browser binary, exit 1 when there is none
#
# Debian's `chromium` package, --no-install-recommends, non-interactive. Without root or
# apt-get it prints a warning and exits 0: the dashboard tests then skip (or fail when CI is set).
set -euo pipefail

find_browser() {
  local b
  for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then
      command -v "$b"
      return 0
    fi
  done
  return 1
}

warn() { echo "browser.sh: warning: $*" >&2; }

check() {
  if find_browser; then return 0; fi
  echo "chromium: missing" >&2
  return 1
}

install() {
  if b=$(find_browser); then
    echo "browser.sh: $b already installed"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    warn "cannot install chromium (needs root and apt-get); dashboard tests will skip"
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  local apt=(apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  local ok=1
  if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null 2>&1; then
    apt-get update -q || ok=0
  fi
  if [ $ok -eq 1 ] && ! "${apt[@]}" install --no-install-recommends chromium fonts-dejavu-core; then
    apt-get update -q && "${apt[@]}" install --no-install-recommends chromium fonts-dejavu-core || ok=0
  fi
  if [ $ok -eq 0 ]; then
    warn "apt-get could not install chromium; dashboard tests will skip"
    return 0
  fi
  check
}

case "${1:-install}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
