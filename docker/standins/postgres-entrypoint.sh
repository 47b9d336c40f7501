#!/bin/sh
# postgres: on the first start (an empty $PGDATA) initdb, then the role $POSTGRES_USER with $POSTGRES_PASSWORD
# and the database $POSTGRES_DB; every start: postgres as user postgres, listening on every interface.
set -eu
if [ "${1:-}" != postgres ]; then exec "$@"; fi
shift
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
  user=${POSTGRES_USER:-postgres} db=${POSTGRES_DB:-${POSTGRES_USER:-postgres}}
  pwfile=$(mktemp) && printf '%s' "$POSTGRES_PASSWORD" >"$pwfile" && chown postgres "$pwfile"
  as_pg initdb -D "$PGDATA" -U "$user" --encoding=UTF8 --locale=C.UTF-8 --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    as_pg pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    as_pg psql -U "$user" -d postgres -v ON_ERROR_STOP=1 -q -c "CREATE DATABASE \"$db\""
    as_pg pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*' "$@"
