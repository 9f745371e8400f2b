#!/usr/bin/env bash
# Runs the scale figures of BENCHMARKS.md (issue 13) in one sitting, so each
# reads as a ratio to references taken on the same machine and database:
# pgbench -N before and after, River's submit mode, and every load-tool
# preset RUNS times (default 3). Run it on a quiet machine: it prints the
# `rest` CPU of each run (load that is not the tool's) so a noisy run shows.
# Prints one summary line per run and the medians at the end; JSON reports
# go to OUT. Needs NODEWARD_TEST_DATABASE_URL.
#
# Usage: [DBS="sqlite postgres"] loadtest/scale-matrix.sh OUT [RUNS] [SECTION ...]
# (DBS: the databases of the deliver and fanout sections.)
# Sections (default: all, in this order): refs deliver fanout hold enroll
# storm replicas config profiles. `profiles` writes pprof's top tables of
# the in-process server: CPU at 1,000 commands/s on Postgres, the heap with
# 15,000 polls held on SQLite (the shapes behind the misses).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NODEWARD_TEST_DATABASE_URL:?set NODEWARD_TEST_DATABASE_URL to the Postgres to measure on}"
out=${1:?usage: loadtest/scale-matrix.sh OUT [RUNS] [SECTION ...]}
runs=${2:-3}
shift $(($# < 2 ? $# : 2))
sections=("$@")
[[ ${#sections[@]} -gt 0 ]] || sections=(refs deliver fanout hold enroll storm replicas config profiles)
mkdir -p "$out"
go build -o "$out/loadtest" ./loadtest

# A database of its own, made fresh (the test database's catalogs bloat with
# every schema the test suites create and drop).
bench_url=$(echo "$NODEWARD_TEST_DATABASE_URL" | sed -E 's#/[^/?]+(\?|$)#/nodeward_bench\1#')
psql "$NODEWARD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS nodeward_bench" -c "CREATE DATABASE nodeward_bench"
PG=(-db postgres -database-url "$bench_url")

summary() { # file
	python3 - "$1" <<'PY'
import json, os, sys
f = sys.argv[1]
r = json.load(open(f))
name = os.path.basename(f)[:-5]
def cpu(c):
    if not c: return ""
    rest = c.get("Rest", c.get("rest", 0))
    busy = c.get("MachineBusy", c.get("machine_busy", 0))
    return f"busy {busy*100:.0f}% rest {rest:.2f}"
if "ratio" in r:  # hold
    d = r["deliver"]
    print(f"{name:28s} bare {r['bare_waiter']['kb_per_held_poll']:.1f} KB server {r['server']['kb_per_held_poll']:.1f} KB ratio {r['ratio']:.2f} "
          f"held {r['server']['long_polls_held']} cores {r['server']['cores_while_holding']:.2f} "
          f"p50/p99 {d['SentP50']:.1f}/{d['SentP99']:.1f} ms settled/s {d['settled_per_s']:.0f} {cpu(d.get('CPU'))}")
elif "all_settled_seconds" in r:  # storm
    print(f"{name:28s} ready {r['ready_seconds']:.1f}s all held {r['all_held_seconds']:.1f}s all settled {r['all_settled_seconds']:.1f}s "
          f"pending at stop {r['pending_at_stop']} lost {r['lost']} twice {r['applied_twice']} redelivered {r['redelivered']} errs {r['agent_errors']}")
elif "concurrency" in r:  # enroll
    l = r["latency_ms"]
    print(f"{name:28s} enrolled {r['enrolled']} failed {r['failed']} {r['enrollments_per_s']:.0f}/s p50/p99 {l['p50']:.1f}/{l['p99']:.1f} ms")
elif "parent_ended_seconds" in r:  # config
    print(f"{name:28s} children {r['children_total']} ok {r['children_succeeded']} all applied {r['all_applied_seconds']:.1f}s parent ended {r['parent_ended_seconds']:.1f}s "
          f"commits/node {r.get('pg_commits_per_node', 0):.1f} agent errs {r['agent_errors']} lagging get p50 {r['lagging_get_p50_ms']:.1f} ms count p50 {r['count_lagging_p50_ms']:.1f} ms")
elif "submit_to_running_ms_p50" in r:  # ledger (pgbench carrier)
    print(f"{name:28s} pgbench -N tps {r.get('pgbench_tps', 0):.0f}")
else:  # deliver
    reps = " ".join(f"[{x['id']} {x['cores']:.2f} cores {x['rss_kb']/1024:.0f} MB held {x['long_polls_held']} files {x['open_files']}]" for x in r.get("replicas") or [])
    print(f"{name:28s} held {r['long_polls_held']} issued/s {r['issued_per_s']:.0f} settled/s {r['settled_per_s']:.0f} "
          f"p50/p99 {r['SentP50']:.1f}/{r['SentP99']:.1f} ms pg commits/s {r.get('pg_commits_per_s', 0):.0f} "
          f"errs {r['issue_errors']}+{r['agent_errors']} missed {r['missed']} {cpu(r.get('CPU'))} {reps}")
PY
}

run() { # name loadtest-args...
	local name=$1
	shift
	echo "== $name $(date -u +%H:%M:%S)" >&2
	if "$out/loadtest" -q -json "$@" >"$out/$name.json" 2>"$out/$name.err"; then
		summary "$out/$name.json" | tee -a "$out/summary.txt"
	else
		echo "$name FAILED: $(tail -3 "$out/$name.err" | tr '\n' ' ')" | tee -a "$out/summary.txt"
	fi
}

pgbench_ref() { # name
	run "$1" -scenario ledger "${PG[@]}" -ops 100 -submitters 4 -pgbench
}

river_ref() {
	local src=${RIVERPEER_SRC:-../shared/bench/riverpeer}
	local db
	db=$(echo "$NODEWARD_TEST_DATABASE_URL" | sed -E 's#/[^/?]+(\?|$)#/riverpeer\1#')
	if [[ ! -d $src ]]; then
		echo "River's peer not found at $src (set RIVERPEER_SRC): skipped" | tee -a "$out/summary.txt"
		return
	fi
	rm -rf "$out/riverpeer-src" && cp -r "$src" "$out/riverpeer-src"
	(cd "$out/riverpeer-src" && go build -o "$out/riverpeer" .)
	psql "$NODEWARD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS riverpeer" -c "CREATE DATABASE riverpeer"
	for i in $(seq "$runs"); do
		for mode in submit burn; do
			echo "river-$mode-$i $("$out/riverpeer" -db "$db" -mode "$mode" -workers 1000 -submitters 64 -jobs 20000 | tr '\n' ' ')" |
				tee -a "$out/summary.txt"
		done
	done
}

for s in "${sections[@]}"; do
	case $s in
	refs)
		pgbench_ref pgbench-before
		river_ref
		;;
	deliver) # single commands, 10,000 agents: the 1,000/s target and saturation
		for db in ${DBS:-sqlite postgres}; do
			args=(-db sqlite)
			[[ $db == postgres ]] && args=("${PG[@]}")
			for i in $(seq "$runs"); do
				run "deliver-$db-1000-$i" "${args[@]}" -agents 10000 -rate 1000 -duration 15s -drain 15s
				run "deliver-$db-sat-$i" "${args[@]}" -agents 10000 -rate 0 -duration 15s -drain 15s
			done
		done
		;;
	fanout) # fleet.command over 100 nodes each, at saturation
		for db in ${DBS:-postgres sqlite}; do
			args=(-db sqlite)
			[[ $db == postgres ]] && args=("${PG[@]}")
			for i in $(seq "$runs"); do
				run "fanout-$db-sat-$i" "${args[@]}" -agents 10000 -fanout 100 -rate 0 -duration 15s -drain 15s
			done
		done
		;;
	hold) # 15,000 agents on the real binary, SQLite, plain and TLS
		for i in $(seq "$runs"); do
			run "hold-plain-$i" -scenario hold -agents 15000 -duration 15s -settle 5s -sample 10s
			run "hold-tls-$i" -scenario hold -agents 15000 -duration 15s -settle 5s -sample 10s -tls
		done
		;;
	enroll)
		for i in $(seq "$runs"); do
			run "enroll-postgres-$i" -scenario enroll "${PG[@]}" -agents 10000 -concurrency 64
			run "enroll-sqlite-$i" -scenario enroll -db sqlite -agents 10000 -concurrency 64
		done
		;;
	storm)
		for i in $(seq "$runs"); do
			run "storm-postgres-kill-$i" -scenario storm "${PG[@]}" -agents 10000 -commands 5000
		done
		run "storm-postgres-term-3rep" -scenario storm "${PG[@]}" -replicas 3 -agents 10000 -commands 5000 -signal term
		# the burst as fleet.command fan-outs: the kill lands while they are created and recorded
		run "storm-postgres-kill-fanout" -scenario storm "${PG[@]}" -agents 10000 -commands 5000 -fanout 100
		;;
	replicas) # 50,000 agents over three server processes on one Postgres
		run "replicas-50k" "${PG[@]}" -replicas 3 -agents 50000 -rate 100 -duration 30s -drain 15s
		;;
	config)
		run "config-postgres-10k" -scenario config "${PG[@]}" -agents 10000 -lagging-nodes 50000
		;;
	profiles)
		run "profile-postgres-1000" "${PG[@]}" -agents 10000 -rate 1000 -duration 15s -drain 15s -cpuprofile "$out/deliver-postgres-1000.cpu.prof"
		go tool pprof -top -cum -nodecount 60 "$out/loadtest" "$out/deliver-postgres-1000.cpu.prof" >"$out/deliver-postgres-1000.cpu.txt" 2>/dev/null || true
		run "profile-sqlite-hold15k" -db sqlite -agents 15000 -rate 100 -duration 10s -drain 10s -memprofile "$out/hold-sqlite-15000.heap.prof"
		go tool pprof -top -sample_index inuse_space -nodecount 40 "$out/loadtest" "$out/hold-sqlite-15000.heap.prof" >"$out/hold-sqlite-15000.heap.txt" 2>/dev/null || true
		;;
	*)
		echo "unknown section $s" >&2
		exit 2
		;;
	esac
done
[[ " ${sections[*]} " == *" refs "* ]] && pgbench_ref pgbench-after
echo "summaries in $out/summary.txt, reports in $out" >&2
