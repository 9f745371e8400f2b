// Package ledgerplans explains, on PostgreSQL, the statements the
// operations ledger (and the desired configuration's reads and writes)
// runs against a large seeded table, and fails on a sequential scan of
// operations, operation_events or node_configs (DECISIONS.md §30).
// cmd/ledgerplans runs it at a million operations for `make plans`, which
// commits docs/ledger-plans.md; this package's test runs it at a small
// scale in CI.
//
// The statements are built by models.LedgerStatements, the same builders
// the store runs, so a plan here is the plan of the store's SQL.
package ledgerplans

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

// Scale sizes the seeded ledger.
type Scale struct {
	// Operations is how many operations are seeded.
	Operations int
	// Nodes is how many distinct nodes operations target.
	Nodes int
	// Open is how many of the newest operations are pending or running.
	Open int
}

// Counts are the seeded table sizes.
type Counts struct {
	Operations, Events, Open, Children int64
}

// Seeded data's shape, shared by Seed and the filter values Queries picks.
const (
	// principals: admins, then package hosts.
	admins       = 4
	packageHosts = 16
	// Every fanEvery-th operation is a fleet-wide fan-out parent; the
	// fanChildren operations after it are its children.
	fanEvery    = 1000
	fanChildren = 20
	// Operations are spaced this many seconds apart, newest now.
	spacing = 5
	// replicaDead owns running operations without a lease (orphans).
	replicaDead = "replica-dead"
)

// kindSpec is one served kind as seeded: its family and channel.
type kindSpec struct {
	name, family, channel, targetKind string
	adminOnly                         bool
}

// servedKinds are the product's kinds (ledger.ServedKinds and the
// credential kinds), the channel following from how each is carried out.
func servedKinds() []kindSpec {
	var out []kindSpec
	for _, k := range servedRegistry().Kinds() { // sorted by name, so seeds repeat
		ch := string(ledger.ChannelLocal)
		if k.Record != nil {
			ch = string(ledger.ChannelLongPoll)
		}
		tk := ledger.TargetNode
		switch {
		case k.Family == ledger.FamilyCredentials:
			tk = ledger.TargetPackageHost
		case k.Family == ledger.FamilyFleet || k.FanOut != nil:
			tk = ledger.TargetFleet // fleet.command, fleet.configure, fleet.diagnose
		}
		out = append(out, kindSpec{k.Name, k.Family, ch, tk, k.AdminOnly})
	}
	// Admin-only kinds last: package hosts draw from the others only.
	sort.SliceStable(out, func(i, j int) bool { return !out[i].adminOnly && out[j].adminOnly })
	return out
}

// servedRegistry holds the product's kinds, as the server's does.
func servedRegistry() *ledger.Registry {
	ks := append(ledger.ServedKinds(nil), ledger.CredentialKinds(nil)...)
	return ledger.NewRegistry(append(ks, ledger.ConfigKinds(nil, nil)...)...)
}

func sqlArray(vals []string) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
	}
	return "ARRAY[" + strings.Join(q, ",") + "]"
}

// principalID is the id of principal number p (0-based).
func principalID(p int) (ledger.PrincipalKind, string) {
	if p < admins {
		return ledger.PrincipalAdmin, fmt.Sprintf("usr_%02d", p)
	}
	return ledger.PrincipalPackageHost, fmt.Sprintf("ph_%02d", p)
}

// opID is the id of operation number i (1-based, also its seq).
func opID(i int) string { return fmt.Sprintf("op_%010d", i) }

// Seed fills the (empty, migrated) ledger tables with one INSERT … SELECT
// each over generate_series, then analyzes them. Operation i (1-based) is
// created i·5 s after the oldest, the newest now:
//   - its principal is one of 20 (4 admins, 16 package hosts), its kind
//     one of every served kind (package hosts: none admin-only) (a fleet.command is always a fan-out
//     parent: every 1000th operation, its 20 successors its children,
//     node commands on nodes of the parent's targets);
//   - the newest sc.Open are pending or running (children held, parents
//     fanning out, a few running locally for a replica without a lease),
//     the rest ended: 85% succeeded, 10% failed, 5% cancelled;
//   - node operations target one of sc.Nodes nodes;
//   - it has 2–4 events, seconds apart.
func Seed(ctx context.Context, db *models.DB, sc Scale) (Counts, error) {
	ks := servedKinds()
	var names, families, channels, targetKinds []string
	var commandKinds []string
	hostKinds := 0
	for _, k := range ks {
		if k.name == ledger.KindFleetCommand {
			continue // only parents are fleet.command
		}
		names, families, channels, targetKinds = append(names, k.name), append(families, k.family),
			append(channels, k.channel), append(targetKinds, k.targetKind)
		if !k.adminOnly {
			hostKinds++
		}
		if k.family == ledger.FamilyCommands {
			commandKinds = append(commandKinds, k.name)
		}
	}
	var pkinds, pids []string
	for p := 0; p < admins+packageHosts; p++ {
		k, id := principalID(p)
		pkinds, pids = append(pkinds, string(k)), append(pids, id)
	}
	n, open := sc.Operations, sc.Open
	// Per row: p the principal, k the kind (-1 a parent, -2 a child), h
	// a third hash for the state and the node. Each is a hash of i with a
	// seed of its own, so no column predicts another (a filter on two of
	// them matches as often as in real use).
	insert := fmt.Sprintf(`
INSERT INTO operations (seq, id, request_id, digest, principal_kind, principal_id, principal_name,
    package_host_generation, family, kind, state, terminal, channel, attempt, targets, target_kind, target_id,
    parent_id, held, counts, reason, operation, result, error_code, error_message, error_retryable, owner,
    created_at, accepted_at, finished_at, deadline, updated_at)
SELECT i, 'op_' || lpad(i::text, 10, '0'), 'req-' || i, md5(i::text), pk[p + 1], pid[p + 1], 'name ' || pid[p + 1],
    CASE WHEN p >= %[1]d THEN 1 ELSE 0 END,
    CASE k WHEN -1 THEN 'fleet' WHEN -2 THEN 'commands' ELSE fam[k + 1] END,
    CASE k WHEN -1 THEN 'fleet.command' WHEN -2 THEN ck[1 + i %% %[2]d] ELSE kn[k + 1] END,
    st, st NOT IN ('pending', 'running'),
    CASE k WHEN -1 THEN 'local' WHEN -2 THEN 'long_poll' ELSE chn[k + 1] END,
    CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
    CASE WHEN tk = 'fleet' THEN '[{"kind":"fleet"}]' ELSE '[{"kind":"' || tk || '","id":"' || tid || '"}]' END,
    tk, tid,
    CASE WHEN k = -2 THEN 'op_' || lpad((i - i %% %[3]d)::text, 10, '0') END,
    k = -2 AND st = 'pending' AND i %% 2 = 0,
    CASE WHEN k = -1 THEN '{"total":%[4]d}' END,
    '', '{}',
    CASE WHEN st = 'succeeded' THEN '{}' END,
    CASE WHEN st = 'failed' THEN 'timeout' END, CASE WHEN st = 'failed' THEN 'timed out' END,
    CASE WHEN st = 'failed' THEN TRUE END,
    CASE WHEN st = 'running' AND chn[k + 1] = 'local' AND k >= 0 THEN
        CASE WHEN i %% 10 = 0 THEN '%[5]s' ELSE 'replica-a' END ELSE '' END,
    at, CASE WHEN st <> 'pending' THEN at + interval '1 second' END,
    CASE WHEN st NOT IN ('pending', 'running') THEN at + interval '2 seconds' END,
    at + interval '1 hour', at + interval '2 seconds'
FROM (
    SELECT i, p, k, h, pk, pid, fam, kn, chn, ck,
        CASE WHEN i > %[6]d - %[7]d THEN (CASE WHEN k = -1 OR i %% 2 = 0 THEN 'running' ELSE 'pending' END)
             WHEN h %% 20 < 17 THEN 'succeeded' WHEN h %% 20 < 19 THEN 'failed' ELSE 'cancelled' END AS st,
        CASE k WHEN -1 THEN 'fleet' WHEN -2 THEN 'node' ELSE tkn[k + 1] END AS tk,
        CASE WHEN k = -1 THEN ''
             WHEN k >= 0 AND tkn[k + 1] = 'package_host' THEN pid[%[1]d + 1 + h / 20 %% %[8]d]
             ELSE 'nod_' || lpad((h / 20 %% %[9]d)::text, 6, '0') END AS tid,
        now() - ((%[6]d - i) * interval '%[10]d seconds') AS at
    FROM (
        SELECT i, p,
            CASE WHEN i %% %[3]d = 0 THEN -1 WHEN i %% %[3]d <= %[4]d AND i > %[3]d THEN -2
                 ELSE (abs(hashint8extended(i, 2) %% CASE WHEN p < %[1]d THEN %[12]d ELSE %[20]d END))::int END AS k,
            abs(hashint8extended(i, 3) %% 1000000000) AS h,
            %[13]s AS pk, %[14]s AS pid, %[15]s AS fam, %[16]s AS kn, %[17]s AS chn, %[18]s AS ck, %[19]s AS tkn
        FROM generate_series(1, %[6]d) AS i, LATERAL (SELECT (abs(hashint8extended(i, 1) %% %[11]d))::int AS p) AS pp
    ) a
) b`,
		admins, len(commandKinds), fanEvery, fanChildren, replicaDead, n, open, packageHosts, sc.Nodes, spacing,
		admins+packageHosts, len(names), sqlArray(pkinds), sqlArray(pids), sqlArray(families), sqlArray(names),
		sqlArray(channels), sqlArray(commandKinds), sqlArray(targetKinds), hostKinds)
	events := `
INSERT INTO operation_events (operation_id, type, at, data)
SELECT o.id, CASE WHEN g = 1 THEN 'created' WHEN g = 2 THEN 'running' WHEN o.terminal THEN o.state ELSE 'progress' END,
    o.created_at + g * interval '1 second', '{}'
FROM operations o, generate_series(1, 2 + (o.seq % 3)::int) AS g
ORDER BY o.seq, g`
	stmts := []string{
		insert,
		fmt.Sprintf(`SELECT setval(pg_get_serial_sequence('operations', 'seq'), %d)`, n),
		events,
		`INSERT INTO operation_owners (replica, expires_at) VALUES ('replica-a', now() + interval '1 minute')`,
		// The nodes operations target, each with a desired configuration:
		// one in 20 lagging, one in 50 never reported, the rest applied.
		fmt.Sprintf(`INSERT INTO nodes (id, rental_id, generation, state, fencing_token, created_at, updated_at)
SELECT 'nod_' || lpad(i::text, 6, '0'), 'rental-' || i, 1, CASE WHEN i %% 100 = 0 THEN 'retired' ELSE 'ready' END, 1, now(), now()
FROM generate_series(0, %d - 1) AS i`, sc.Nodes),
		`INSERT INTO node_configs (node_id, revision, hash, format, updated_at, settled, reported_revision, reported_hash,
    reported_state, reported_message, reported_at, reported_fencing, applied_revision, lagging, delivered_fencing, delivered_revision, delivered_at)
SELECT id, 3, 'h3', 'plans/v1', now(), NOT (lag OR never), CASE WHEN never THEN NULL WHEN lag THEN 2 ELSE 3 END,
    CASE WHEN never THEN NULL WHEN lag THEN 'h2' ELSE 'h3' END, CASE WHEN never THEN NULL ELSE 'applied' END,
    CASE WHEN never THEN NULL ELSE '' END, CASE WHEN never THEN NULL ELSE now() END, CASE WHEN never THEN NULL ELSE 1 END,
    CASE WHEN never THEN 0 WHEN lag THEN 2 ELSE 3 END, lag, 1, 3, now()
FROM (SELECT id, seq % 20 = 1 AS lag, seq % 50 = 7 AS never
      FROM (SELECT id, row_number() OVER (ORDER BY id) AS seq FROM nodes) n) c`,
		`ANALYZE operations`, `ANALYZE operation_events`, `ANALYZE operation_owners`, `ANALYZE nodes`, `ANALYZE node_configs`,
	}
	for _, s := range stmts {
		if err := db.WithContext(ctx).Exec(s).Error; err != nil {
			return Counts{}, fmt.Errorf("seed: %w", err)
		}
	}
	var c Counts
	err := db.WithContext(ctx).Raw(`SELECT
		(SELECT COUNT(*) FROM operations),
		(SELECT COUNT(*) FROM operation_events),
		(SELECT COUNT(*) FROM operations WHERE terminal = FALSE),
		(SELECT COUNT(*) FROM operations WHERE parent_id IS NOT NULL)`).Row().Scan(&c.Operations, &c.Events, &c.Open, &c.Children)
	return c, err
}
