package main

import (
	"context"
	"fmt"

	"github.com/nodeward/nodeward/internal/ledgerplans"
	"github.com/nodeward/nodeward/models"
)

// scale sizes the seeded fleet.
type scale struct {
	Nodes, Operations, Open int
}

// busyNode is the node most operations, commands and audit rows name: the
// node page's worst case.
const busyNode = "nod_000001"

// seed fills a migrated, empty database: the ledger through
// internal/ledgerplans (its operations target nodes nod_000000…), then the
// nodes those operations name, their commands, audit trails and
// configuration, the secret audit and the package hosts that appear as
// principals. Everything is one INSERT … SELECT over generate_series per
// table, then VACUUM (ANALYZE), so a million operations seed in a few minutes.
func seed(ctx context.Context, db *models.DB, sc scale) error {
	if _, err := ledgerplans.Seed(ctx, db, ledgerplans.Scale{Operations: sc.Operations, Nodes: sc.Nodes, Open: sc.Open}); err != nil {
		return err
	}
	n := sc.Nodes
	stmts := []string{
		// ledgerplans seeds bare nodes (and their configuration) for its
		// own plans; the console's nodes below replace them whole.
		`DELETE FROM node_configs`,
		`DELETE FROM nodes`,
		// Mixed states (70% ready, 15% lost, 10% retired, 5% enrolling),
		// one created a minute after another. Ready leases run an hour
		// and more (so they hold for the run), one in fifty lapsing within
		// 30 s, so the "about to lapse" filter has matches.
		fmt.Sprintf(`
INSERT INTO nodes (id, rental_id, generation, state, fencing_token, created_at, updated_at, enrolled_at,
    lease_expires_at, last_heartbeat_at, retired_at, agent_version, facts, facts_observed_at, facts_received_at,
    disk_state, disk_free_bytes, disk_observed_at, price_micros, billing_interval_seconds)
SELECT 'nod_' || lpad(i::text, 6, '0'), 'rack-' || (i / 40) || '-slot-' || (i %% 40), 1, st,
    CASE WHEN st = 'enrolling' THEN 0 ELSE 1 + i %% 3 END,
    c, now(), CASE WHEN st <> 'enrolling' THEN c + interval '1 minute' END,
    CASE WHEN st = 'ready' AND i %% 50 = 0 THEN now() + (i %% 30) * interval '1 second'
         WHEN st = 'ready' THEN now() + interval '1 hour' + (i %% 90) * interval '1 second'
         WHEN st = 'lost' THEN now() - interval '10 minutes' END,
    CASE WHEN st = 'ready' THEN now() - (i %% 30) * interval '1 second'
         WHEN st IN ('lost', 'retired') THEN now() - interval '1 hour' END,
    CASE WHEN st = 'retired' THEN now() - interval '30 minutes' END,
    CASE WHEN st = 'enrolling' THEN '' ELSE '1.4.' || (i %% 3) END,
    CASE WHEN st <> 'enrolling' THEN json_build_object('hostname', 'host-' || i, 'os', 'linux',
        'arch', CASE WHEN i %% 4 = 0 THEN 'arm64' ELSE 'amd64' END, 'cpus', 2 << (i %% 5),
        'memory_bytes', (4::bigint << 30) * (1 + i %% 8), 'disk_free_bytes', (i %% 500)::bigint << 30,
        'agent_version', '1.4.' || (i %% 3), 'runtimes', json_build_array('process', 'docker'),
        'labels', json_build_object('zone', 'z' || (i %% 7)),
        'capabilities', json_build_array('commands.v1', 'config.v1', 'diag.v1'),
        'observed_at', to_char((now() - interval '1 minute') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))::text END,
    CASE WHEN st <> 'enrolling' THEN now() - interval '1 minute' END,
    CASE WHEN st <> 'enrolling' THEN now() - interval '1 minute' END,
    CASE WHEN st = 'enrolling' THEN 'never_reported' WHEN i %% 50 = 0 THEN 'unmeasurable' ELSE 'measured' END,
    CASE WHEN st <> 'enrolling' AND i %% 50 <> 0 THEN (i %% 500)::bigint << 30 END,
    CASE WHEN st <> 'enrolling' AND i %% 50 <> 0 THEN now() - interval '1 minute' END,
    CASE WHEN i %% 3 = 0 THEN 250000 + i %% 7 * 10000 END, CASE WHEN i %% 3 = 0 THEN 3600 END
FROM (
    SELECT i, now() - (%[1]d - i) * interval '1 minute' AS c,
        CASE WHEN i = 1 THEN 'ready' WHEN i %% 20 < 14 THEN 'ready' WHEN i %% 20 < 17 THEN 'lost'
             WHEN i %% 20 < 19 THEN 'retired' ELSE 'enrolling' END AS st
    FROM generate_series(0, %[1]d - 1) AS i
) a`, n),
		// The busy node: one node operation in fifty is its.
		fmt.Sprintf(`UPDATE operations SET target_id = '%[1]s', targets = '[{"kind":"node","id":"%[1]s"}]'
WHERE target_kind = 'node' AND seq %% 50 = 7`, busyNode),
		// A command for every node operation of the commands family,
		// settled as its operation ended.
		`
INSERT INTO commands (operation_id, node_id, kind, payload, payload_digest, fencing_token, issued_at, state,
    failure_code, failure_message, delivered_fencing, first_delivered_at, last_delivered_at, delivery_count, settled_at)
SELECT o.id, o.target_id, regexp_replace(o.kind, '^[^.]*\.', ''), '{}', o.digest, 1, o.created_at,
    CASE o.state WHEN 'pending' THEN 'pending' WHEN 'running' THEN 'pending' WHEN 'succeeded' THEN 'applied'
                 WHEN 'failed' THEN 'refused' ELSE 'cancelled' END,
    CASE WHEN o.state = 'failed' THEN 'timeout' END, CASE WHEN o.state = 'failed' THEN 'timed out' END,
    CASE WHEN o.state <> 'pending' THEN 1 END, CASE WHEN o.state <> 'pending' THEN o.created_at END,
    CASE WHEN o.state <> 'pending' THEN o.created_at END, CASE WHEN o.state <> 'pending' THEN 1 ELSE 0 END,
    o.finished_at
FROM operations o JOIN nodes n ON n.id = o.target_id
WHERE o.family = 'commands' AND o.target_kind = 'node'`,
		// Each node's trail: invited and enrolled; the busy node 2,000 more.
		`
INSERT INTO node_audit (at, actor, action, node_id, detail)
SELECT n.created_at + g * interval '1 second', CASE WHEN g = 1 THEN 'admin:usr_00' ELSE 'agent' END,
    CASE WHEN g = 1 THEN 'invited' ELSE 'enrolled' END, n.id, '{}'
FROM nodes n, generate_series(1, 2) AS g
WHERE g = 1 OR n.state <> 'enrolling'
ORDER BY n.created_at, g`,
		fmt.Sprintf(`
INSERT INTO node_audit (at, actor, action, node_id, detail)
SELECT now() - (2000 - g) * interval '1 minute', 'agent', 'reenrolled', '%s', '{}'
FROM generate_series(1, 2000) AS g`, busyNode),
		// Desired configuration on one node in five; one in ten of those
		// lagging behind it.
		`
INSERT INTO node_configs (node_id, revision, hash, format, key_id, box, sealed_pointers, size_bytes, updated_at,
    operation_id, settled, reported_revision, reported_hash, reported_state, reported_at, reported_fencing,
    applied_revision, lagging)
SELECT n.id, 1 + i % 3, md5(n.id), 'json', '', NULL, '[]', 0, now() - interval '1 hour', '',
    i % 50 <> 0, CASE WHEN i % 50 = 0 THEN i % 3 ELSE 1 + i % 3 END, md5(n.id), 'applied',
    now() - interval '30 minutes', 1, CASE WHEN i % 50 = 0 THEN i % 3 ELSE 1 + i % 3 END, i % 50 = 0
FROM (SELECT id, substr(id, 5)::int AS i FROM nodes WHERE state IN ('ready', 'lost')) n
WHERE i % 5 = 0`,
		// The secret audit: one row per five operations, on their
		// principals and targets; mostly uses and seals, a few denials.
		`
INSERT INTO secret_audit (at, action, outcome, principal_kind, principal_id, handle_digest, request_id,
    operation_id, target_kind, target_id, field)
SELECT o.created_at, a.action, CASE WHEN o.seq % 97 = 0 THEN 'denied' WHEN a.action = 'expire' THEN 'expired' ELSE 'ok' END,
    o.principal_kind, o.principal_id, md5(o.id), o.request_id, o.id, o.target_kind, o.target_id,
    '/env/SECRET_' || (o.seq % 9)
FROM operations o, LATERAL (SELECT CASE WHEN o.seq / 5 % 20 < 8 THEN 'seal' WHEN o.seq / 5 % 20 < 16 THEN 'use'
                                       WHEN o.seq / 5 % 20 < 19 THEN 'reveal' ELSE 'expire' END AS action) a
WHERE o.seq % 5 = 0 AND o.target_kind <> 'fleet'
ORDER BY o.seq`,
		// The package hosts that sign operations, and the console's own
		// trail.
		`
INSERT INTO package_hosts (id, name, families, generation, created_at, updated_at, revoked_at)
SELECT DISTINCT principal_id, 'host ' || principal_id, '["commands","workloads"]', 1, now() - interval '90 days',
    now() - interval '90 days', NULL::timestamptz
FROM operations WHERE principal_kind = 'package_host'`,
		`
INSERT INTO admin_audit (at, actor, action, target, outcome, remote_addr, detail)
SELECT now() - (10000 - g) * interval '1 minute', 'ada', CASE WHEN g % 3 = 0 THEN 'login' ELSE 'token.create' END,
    '', 'ok', '127.0.0.1', ''
FROM generate_series(1, 10000) AS g`,
		// As autovacuum leaves a table at rest: statistics current and the
		// visibility map set, so index-only counts read no heap.
		`VACUUM (ANALYZE) nodes`, `VACUUM (ANALYZE) operations`, `VACUUM (ANALYZE) operation_events`,
		`VACUUM (ANALYZE) commands`, `VACUUM (ANALYZE) node_audit`, `VACUUM (ANALYZE) node_configs`,
		`VACUUM (ANALYZE) secret_audit`, `VACUUM (ANALYZE) package_hosts`, `VACUUM (ANALYZE) admin_audit`,
		`VACUUM (ANALYZE) node_state_counts`,
	}
	for _, s := range stmts {
		if err := db.WithContext(ctx).Exec(s).Error; err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	return nil
}
