#!/usr/bin/env bash
# Runs the delivery load matrix of BENCHMARKS.md: each configuration RUNS
# times (default 3), one JSON report per run in OUT (default a temp dir),
# then the pgbench reference once. Needs NODEWARD_TEST_DATABASE_URL for the
# Postgres half. Usage: loadtest/matrix.sh [OUT] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d -t nodeward-load-XXXXXX)}
runs=${2:-3}
mkdir -p "$out"
go build -o "$out/loadtest" ./loadtest
dbs=(sqlite)
if [[ -n "${NODEWARD_TEST_DATABASE_URL:-}" ]]; then dbs+=(postgres); fi
# agents rate: the target (10k waiting, 1,000/s), the same with 1k
# agents, an unsaturated rate (100/s) for the latency floor, and full speed.
plan=(
	"1000 1000"
	"1000 100"
	"10000 1000"
	"10000 100"
	"1000 0"
)
for db in "${dbs[@]}"; do
	for p in "${plan[@]}"; do
		read -r agents rate <<<"$p"
		for i in $(seq "$runs"); do
			echo "== $db agents=$agents rate=$rate run $i" >&2
			"$out/loadtest" -q -json -db "$db" -agents "$agents" -rate "$rate" -issuers 64 \
				-duration 15s -drain 10s >"$out/$db-$agents-$rate-$i.json"
		done
	done
done
if [[ -n "${NODEWARD_TEST_DATABASE_URL:-}" ]]; then
	"$out/loadtest" -q -json -db postgres -agents 10 -rate 10 -duration 1s -pgbench >"$out/pgbench.json"
fi
echo "reports in $out" >&2
