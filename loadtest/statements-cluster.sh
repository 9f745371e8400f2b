#!/usr/bin/env bash
# A private PostgreSQL cluster for measuring what Postgres executes per
# statement (BENCHMARKS.md, thirty-fourth sitting): pg_stat_statements needs
# shared_preload_libraries, which means a restart, and the shared server is
# never restarted for a measurement. The cluster has the Debian defaults
# (the shared server's memory settings), listens on 127.0.0.1:PORT only, and
# lives in DIR until `stop`.
#
# Usage:
#   loadtest/statements-cluster.sh start [DIR] [PORT] [AUTOVACUUM]  # prints the URL
#   loadtest/statements-cluster.sh stop  [DIR]
# DIR defaults to /tmp/nodeward-pgstat, PORT to 5433, AUTOVACUUM (on|off)
# to on, Postgres's default. Then, for example:
#   psql "$URL" -c 'SELECT pg_stat_statements_reset()'   # as the issue window begins
#   go run ./loadtest -db postgres -database-url "$URL" -agents 10000 -rate 1000 -duration 15s
#   psql "$URL" -c 'SELECT calls, total_plan_time, total_exec_time, shared_blks_hit, wal_records, query
#                   FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 20'
set -euo pipefail
cmd=${1:?usage: loadtest/statements-cluster.sh start|stop [DIR] [PORT] [AUTOVACUUM]}
dir=${2:-/tmp/nodeward-pgstat}
port=${3:-5433}
autovacuum=${4:-on}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
# initdb and the server refuse to run as root: run them as postgres then.
as_owner() { if [[ $(id -u) -eq 0 ]]; then su postgres -c "$*"; else bash -c "$*"; fi; }

case $cmd in
start)
	if [[ ! -d $dir/data ]]; then
		mkdir -p "$dir"
		[[ $(id -u) -ne 0 ]] || chown postgres "$dir"
		as_owner "'$bin/initdb' -D '$dir/data' -A trust -U postgres" >/dev/null
		cat >>"$dir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 200
autovacuum = $autovacuum
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track_planning = on
pg_stat_statements.max = 5000
EOF
	fi
	as_owner "'$bin/pg_ctl' -D '$dir/data' -l '$dir/log' -w start" >/dev/null
	psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 ||
		psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE test"
	psql -h 127.0.0.1 -p "$port" -U postgres -d test -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
	echo "postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
	;;
stop)
	as_owner "'$bin/pg_ctl' -D '$dir/data' -m fast -w stop" >/dev/null
	rm -rf "$dir"
	;;
*)
	echo "usage: loadtest/statements-cluster.sh start|stop [DIR] [PORT] [AUTOVACUUM]" >&2
	exit 2
	;;
esac
