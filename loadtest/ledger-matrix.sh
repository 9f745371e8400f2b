#!/usr/bin/env bash
# Runs the ledger benchmark of BENCHMARKS.md in one sitting, so every figure
# reads as a ratio to references taken on the same machine and database:
# the ledger scenario (no-op kind) RUNS times (default 3) per configuration,
# River's submit mode (../shared/bench/riverpeer, built in a temp dir) RUNS
# times, and pgbench -N once. Prints a summary line per run; JSON reports
# go to OUT (default a temp dir). Needs NODEWARD_TEST_DATABASE_URL.
# Usage: loadtest/ledger-matrix.sh [OUT] [RUNS] [OPS]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NODEWARD_TEST_DATABASE_URL:?set NODEWARD_TEST_DATABASE_URL to the Postgres to measure on}"
out=${1:-$(mktemp -d -t nodeward-ledger-XXXXXX)}
runs=${2:-3}
ops=${3:-20000}
mkdir -p "$out"
go build -o "$out/loadtest" ./loadtest

# A database of its own, made fresh: the test database's catalogs bloat with
# every schema the test suites create and drop (pg_attribute had 1.7 M dead
# rows here once), which slows every new connection and plan.
bench_url=$(echo "$NODEWARD_TEST_DATABASE_URL" | sed -E 's#/[^/?]+(\?|$)#/nodeward_bench\1#')
psql "$NODEWARD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS nodeward_bench" -c "CREATE DATABASE nodeward_bench"
river_src=${RIVERPEER_SRC:-../shared/bench/riverpeer}
river_db=${RIVERPEER_DATABASE_URL:-$(echo "$NODEWARD_TEST_DATABASE_URL" | sed -E 's#/[^/?]+(\?|$)#/riverpeer\1#')}
if [[ ! -d $river_src ]]; then
	echo "River's peer not found at $river_src (set RIVERPEER_SRC): measuring without it" >&2
else
	cp -r "$river_src" "$out/riverpeer-src"
	(cd "$out/riverpeer-src" && go build -o "$out/riverpeer" .)
	psql "$NODEWARD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS riverpeer" -c "CREATE DATABASE riverpeer"
fi

summary() { # file label
	python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:34s} succeeded/s {r['succeeded_per_second']:7.0f}  submit→running p50 {r['submit_to_running_ms_p50']:7.1f} ms  p99 {r['submit_to_running_ms_p99']:7.1f} ms  rest-cpu {r['cpu']['rest']:.2f}")
PY
}

# workers: the default (16) and River's setting scaled to one core (128).
configs=(
	"sqlite 1 16"
	"sqlite 1 128"
	"postgres 1 16"
	"postgres 1 128"
	"postgres 2 128"
)
for c in "${configs[@]}"; do
	read -r db replicas workers <<<"$c"
	for i in $(seq "$runs"); do
		f="$out/ledger-$db-r$replicas-w$workers-$i.json"
		"$out/loadtest" -q -json -scenario ledger -db "$db" -database-url "$bench_url" -replicas "$replicas" \
			-ledger-workers "$workers" -ops "$ops" -submitters 64 >"$f"
		summary "$f" "ledger $db replicas=$replicas workers=$workers #$i"
	done
done
if [[ -x $out/riverpeer ]]; then
	for i in $(seq "$runs"); do
		echo "river submit #$i: $("$out/riverpeer" -db "$river_db" -mode submit -workers 1000 -submitters 64 -jobs "$ops" | tr '\n' ' ')"
	done
fi
"$out/loadtest" -q -json -scenario ledger -db postgres -database-url "$bench_url" -ops 100 -submitters 4 -pgbench >"$out/pgbench.json"
python3 -c "import json,sys; print('pgbench -N tps', round(json.load(open(sys.argv[1]))['pgbench_tps']))" "$out/pgbench.json"
echo "reports in $out" >&2
