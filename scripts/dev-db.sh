#!/usr/bin/env bash
# A database for the documentation's examples, from the Debian packages scripts/services.sh
# installs: one command, idempotent, on 127.0.0.1 only.
#
#   bash scripts/dev-db.sh postgres start   # PostgreSQL on 127.0.0.1:5432: role and database
#                                           # `app` (no password), max_prepared_transactions=64
#   bash scripts/dev-db.sh mariadb start    # MariaDB on 127.0.0.1:3306: user and database `app`
#   bash scripts/dev-db.sh postgres stop    # (or mariadb) stop it; `status` tells
#
# Data in $NOTIFY_DB_DIR/<name> (default /var/tmp/notify-db/<name>); ports from
# NOTIFY_PG_PORT and NOTIFY_MARIADB_PORT. The URLs the examples use:
#   postgresql://app@127.0.0.1/app   (SQLAlchemy: postgresql+psycopg://app@127.0.0.1/app)
#   mysql+pymysql://app@127.0.0.1/app
set -euo pipefail
BASE=${NOTIFY_DB_DIR:-/var/tmp/notify-db}
PG_PORT=${NOTIFY_PG_PORT:-5432}
MY_PORT=${NOTIFY_MARIADB_PORT:-3306}

die() { echo "dev-db.sh: $*" >&2; exit 1; }
# run as the server's own user when root (initdb and mariadbd refuse to run as root)
as() { local user=$1; shift; if [ "$(id -u)" = 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi; }
own() { mkdir -p "$1"; if [ "$(id -u)" = 0 ]; then chown "$2:$2" "$1"; fi; }

pg_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] || die "PostgreSQL is not installed (bash scripts/services.sh install)"
  echo "$d"
}

do_postgres() {
  local dir=$BASE/postgres bin
  bin=$(pg_bin)
  case $1 in
    start)
      mkdir -p "$BASE" && chmod 755 "$BASE" && own "$dir" postgres
      if [ ! -f "$dir/data/PG_VERSION" ]; then
        as postgres "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
          --no-locale >"$dir/initdb.log"
      fi
      if ! as postgres "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o \
          "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories=$dir -c max_prepared_transactions=64" \
          start >/dev/null
      fi
      local psql=("$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qtA)
      if [ -z "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = 'app'")" ]; then
        "${psql[@]}" -c "CREATE ROLE app LOGIN"
      fi
      if [ -z "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'app'")" ]; then
        "${psql[@]}" -c "CREATE DATABASE app OWNER app"
      fi
      echo "postgresql://app@127.0.0.1:$PG_PORT/app (max_prepared_transactions=64; data in $dir)"
      ;;
    stop) as postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w stop ;;
    status) as postgres "$bin/pg_ctl" -D "$dir/data" status ;;
    *) usage ;;
  esac
}

do_mariadb() {
  local dir=$BASE/mariadb
  local client=(mariadb --no-defaults -uroot -h127.0.0.1 -P"$MY_PORT")
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] \
    || die "MariaDB is not installed (bash scripts/services.sh install)"
  case $1 in
    start)
      mkdir -p "$BASE" && chmod 755 "$BASE" && own "$dir" mysql
      if [ ! -d "$dir/data/mysql" ]; then
        as mysql mariadb-install-db --no-defaults --datadir="$dir/data" \
          --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log"
      fi
      if ! "${client[@]}" -e "SELECT 1" >/dev/null 2>&1; then
        as mysql setsid /usr/sbin/mariadbd --no-defaults --datadir="$dir/data" \
          --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --port="$MY_PORT" \
          --bind-address=127.0.0.1 --skip-name-resolve --log-error="$dir/err.log" \
          </dev/null >/dev/null 2>&1 &
        for _ in $(seq 1 150); do
          "${client[@]}" -e "SELECT 1" >/dev/null 2>&1 && break
          sleep 0.1
        done
        "${client[@]}" -e "SELECT 1" >/dev/null || die "MariaDB did not start: see $dir/err.log"
      fi
      "${client[@]}" -e "CREATE DATABASE IF NOT EXISTS app;
        CREATE USER IF NOT EXISTS 'app'@'127.0.0.1';
        GRANT ALL ON app.* TO 'app'@'127.0.0.1'"
      echo "mysql+pymysql://app@127.0.0.1:$MY_PORT/app (data in $dir)"
      ;;
    stop) mariadb-admin --no-defaults -uroot -h127.0.0.1 -P"$MY_PORT" shutdown ;;
    status) "${client[@]}" -e "SELECT VERSION()" ;;
    *) usage ;;
  esac
}

usage() { echo "usage: $0 postgres|mariadb start|stop|status" >&2; exit 2; }

case "${1:-}:${2:-}" in
  postgres:start|postgres:stop|postgres:status) do_postgres "$2" ;;
  mariadb:start|mariadb:stop|mariadb:status) do_mariadb "$2" ;;
  *) usage ;;
esac
