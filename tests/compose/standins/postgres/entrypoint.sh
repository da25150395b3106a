#!/bin/sh
set -eu
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?the real image refuses to start without POSTGRES_PASSWORD}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" -E UTF8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    echo "stand-in: temporary server on the unix socket only (initialisation)"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    sleep "${JOBQ_STANDIN_INIT_DELAY:-0}"
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres -q \
            -c "CREATE DATABASE \"$db\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "stand-in: initialisation complete; ready for start up"
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
