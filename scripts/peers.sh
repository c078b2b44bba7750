#!/usr/bin/env bash
# Peer servers for bench/peers.py (Redis 7, RabbitMQ 3.10 and NATS 2.9 from Debian) and its
# Python extra.
#
#   bash scripts/peers.sh install   # idempotent: apt-get installs what is missing, pip the extra
#   bash scripts/peers.sh check     # list which peers are present (exit 1 when one is missing)
#
# --no-install-recommends, non-interactive; the daemons are never started as system services
# (bench/peers.py runs its own instances on 127.0.0.1 in temp dirs and stops them by PID).
# Without root or apt-get it prints a warning and exits 0: the bench then skips that peer.
set -euo pipefail
cd "$(dirname "$0")/.."

have_redis() { command -v redis-server >/dev/null 2>&1; }
have_rabbitmq() { [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; }
have_nats() { command -v nats-server >/dev/null 2>&1; }

check() {
  local rc=0
  if have_redis; then echo "redis-server: ok ($(redis-server --version | awk '{print $3}'))"
  else echo "redis-server: missing"; rc=1; fi
  if have_rabbitmq; then echo "rabbitmq-server: ok"; else echo "rabbitmq-server: missing"; rc=1; fi
  if have_nats; then echo "nats-server: ok ($(nats-server --version | awk '{print $2}'))"
  else echo "nats-server: missing"; rc=1; fi
  return $rc
}

warn() { echo "peers.sh: warning: $*" >&2; }

install_python() {
  # the optional extra `bench` (pika, redis, nats-py, matplotlib) into the project venv
  [ -x .venv/bin/python ] || bash scripts/setup.sh
  local pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  if grep -Eq '^bench *= *\[' pyproject.toml; then
    "${pip[@]}" -e ".[bench]"
  else
    "${pip[@]}" "pika>=1.3" "redis>=5" "nats-py>=2.6" "matplotlib>=3.8"
  fi
}

install() {
  local pkgs=()
  have_redis || pkgs+=(redis-server)
  have_rabbitmq || pkgs+=(rabbitmq-server)
  have_nats || pkgs+=(nats-server)
  if [ ${#pkgs[@]} -eq 0 ]; then
    echo "peers.sh: redis-server, rabbitmq-server, nats-server already installed"
    install_python
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    warn "cannot install ${pkgs[*]} (needs root and apt-get); bench/peers.py will skip them"
    install_python
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
  if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null 2>&1; then
    apt-get update -q || ok=0
  fi
  if [ $ok -eq 1 ] && ! "${apt[@]}" install --no-install-recommends "${pkgs[@]}"; then
    apt-get update -q && "${apt[@]}" install --no-install-recommends "${pkgs[@]}" || ok=0
  fi
  if [ $created_policy -eq 1 ]; then rm -f "$policy"; fi
  if [ $ok -eq 0 ]; then
    warn "apt-get could not install ${pkgs[*]}; bench/peers.py will skip them"
  fi
  install_python
  check || true
}

case "${1:-install}" in
  install) install ;;
  check) check ;;
  *) echo "usage: $0 [install|check]" >&2; exit 2 ;;
esac
