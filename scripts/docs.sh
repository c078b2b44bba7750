#!/usr/bin/env bash
# What the documentation site needs beyond its Python packages (the `docs` extra):
# Mermaid, which draws the site's diagrams in the reader's browser, served from the site
# itself instead of a CDN (the site then works offline and the browser test sees diagrams).
#
#   bash scripts/docs.sh install   # idempotent: docs/assets/javascripts/mermaid.min.js from
#                                  # the npm registry's `mermaid` package (major 11, the one
#                                  # mkdocs-material drives); skipped with a warning without npm
#   bash scripts/docs.sh check     # exit 1 when it is missing
#
# Without it the site still builds and renders; the theme then loads Mermaid from unpkg.com.
set -euo pipefail
cd "$(dirname "$0")/.."
MERMAID_MAJOR=11
TARGET=docs/assets/javascripts/mermaid.min.js

warn() { echo "docs.sh: warning: $*" >&2; }

install() {
  if [ -s "$TARGET" ]; then
    echo "docs.sh: $TARGET already installed"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    warn "npm not found: diagrams will load Mermaid from unpkg.com (apt-get install npm)"
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  if ! (cd "$tmp" && npm pack "mermaid@$MERMAID_MAJOR" --silent >/dev/null 2>&1); then
    warn "npm pack mermaid@$MERMAID_MAJOR failed: diagrams will load Mermaid from unpkg.com"
    return 0
  fi
  tar -xzf "$tmp"/mermaid-*.tgz -C "$tmp" package/dist/mermaid.min.js
  mkdir -p "$(dirname "$TARGET")"
  mv "$tmp/package/dist/mermaid.min.js" "$TARGET"
  echo "docs.sh: installed $TARGET ($(basename "$tmp"/mermaid-*.tgz .tgz))"
}

check() {
  if [ -s "$TARGET" ]; then echo "mermaid: $TARGET"; return 0; fi
  echo "mermaid: missing" >&2
  return 1
}

case "${1:-install}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
