#!/usr/bin/env bash
# Real servers used by the test suite (tests/services.py starts them on loopback).
#
#   bash scripts/services.sh install   # idempotent: apt-get installs what is missing
#   bash scripts/services.sh check     # list which server binaries are present
#
# Installs ZooKeeper, MariaDB and PostgreSQL with --no-install-recommends, non-interactive,
# and never starts them as system services (tests run their own instances in temp dirs).
# Without root or apt-get it prints a warning and exits 0: the tests that need a missing
# server are then skipped (or fail when CI is set).
set -euo pipefail

have_zookeeper() { [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; }
have_mariadb() {
  command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]
}
have_postgres() { compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1; }

check() {
  local rc=0
  if have_zookeeper; then echo "zookeeper: ok"; else echo "zookeeper: missing"; rc=1; fi
  if have_mariadb; then echo "mariadb: ok"; else echo "mariadb: missing"; rc=1; fi
  if have_postgres; then echo "postgresql: ok"; else echo "postgresql: missing"; rc=1; fi
  return $rc
}

warn() { echo "services.sh: warning: $*" >&2; }

install() {
  local pkgs=()
  have_zookeeper || pkgs+=(zookeeper)
  have_mariadb || pkgs+=(mariadb-server)
  have_postgres || pkgs+=(postgresql)
  if [ ${#pkgs[@]} -eq 0 ]; then
    echo "services.sh: zookeeper, mariadb, postgresql already installed"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    warn "cannot install ${pkgs[*]} (needs root and apt-get); tests needing them will skip"
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Never let the packages start their daemons (there is no service manager anyway).
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
  fi
  local ok=1
  local apt=(apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  # apt-get update only when the package lists are empty or an install fails for lack of them.
  if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null 2>&1; then
    apt-get update -q || ok=0
  fi
  if [ $ok -eq 1 ] && ! "${apt[@]}" install --no-install-recommends "${pkgs[@]}"; then
    apt-get update -q && "${apt[@]}" install --no-install-recommends "${pkgs[@]}" || ok=0
  fi
  if [ $created_policy -eq 1 ]; then rm -f "$policy"; fi
  if [ $ok -eq 0 ]; then
    warn "apt-get could not install ${pkgs[*]}; tests needing them will skip"
    return 0
  fi
  check || true
}

case "${1:-install}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
