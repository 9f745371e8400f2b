package fleet

import (
	"context"
	"math"
	"strconv"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// EventsResult counts what a batch changed.
type EventsResult struct {
	Recorded   int
	Duplicates int
}

var workloadStates = map[string]bool{api.WorkloadCreated: true, api.WorkloadRunning: true, api.WorkloadExited: true}

func validateEvents(events []api.Event) error {
	var v errcode.Validation
	v.Check(len(events) <= MaxEventBatch, "events", "at most %d per request", MaxEventBatch)
	for i, e := range events {
		field := "events/" + strconv.Itoa(i)
		v.Check(e.ID != "" && len(e.ID) <= 128, field+"/id", "required, at most 128 characters")
		v.Check(!e.ObservedAt.IsZero(), field+"/observed_at", "required")
		switch e.Kind {
		case api.EventHeartbeat:
			v.Check(e.Workload == nil, field+"/workload", "not allowed on a heartbeat")
			v.Check(e.Config == nil, field+"/config", "not allowed on a heartbeat")
			if e.Facts != nil {
				validateFacts(&v, field+"/facts", *e.Facts)
			}
		case api.EventWorkload:
			v.Check(e.Facts == nil, field+"/facts", "not allowed on a workload event")
			v.Check(e.Config == nil, field+"/config", "not allowed on a workload event")
			if e.Workload == nil {
				v.Add(field+"/workload", "required for a workload event")
				continue
			}
			w := e.Workload
			v.Check(idPattern.MatchString(w.RunID), field+"/workload/run_id", "required")
			v.Check(idPattern.MatchString(w.AttemptID), field+"/workload/attempt_id", "required")
			v.Check(workloadStates[w.State], field+"/workload/state", "one of created, running, exited")
			v.Check((w.State == api.WorkloadExited) == (w.ExitCode != nil), field+"/workload/exit_code", "required with exited, and only then")
			v.Check(w.ExitCode == nil || (*w.ExitCode >= math.MinInt32 && *w.ExitCode <= math.MaxInt32), field+"/workload/exit_code", "a 32-bit integer")
			v.Check(!w.ObservedAt.IsZero(), field+"/workload/observed_at", "required")
		case api.EventConfig:
			validateConfigEvent(&v, field, e)
		default:
			v.Add(field+"/kind", "one of heartbeat, workload, config")
		}
	}
	return v.Err()
}

// RecordEvents takes a node's reports. Workload events are recorded once
// per (node, event id), so a spool replayed after a reconnection changes
// nothing; the latest observation per run and attempt is kept. Config
// reports are deduplicated the same way and kept as the node's last
// (DECISIONS.md §32). A heartbeat
// renews the lease (never a retired node's) and stores facts with the
// node's own observation time; heartbeats ride a group commit and their ids
// are not stored. Errors: validation_failed.
func (s *Service) RecordEvents(ctx context.Context, sess Session, events []api.Event) (EventsResult, error) {
	if err := validateEvents(events); err != nil {
		return EventsResult{}, err
	}
	now := s.clock()
	var res EventsResult
	var workloads []api.Event
	var beat *api.Event
	for i := range events {
		e := &events[i]
		if e.Kind == api.EventHeartbeat {
			// Only the newest heartbeat of a batch matters.
			if beat == nil || !e.ObservedAt.Before(beat.ObservedAt) {
				if beat != nil && beat.Facts != nil && e.Facts == nil {
					e.Facts = beat.Facts
				}
				beat = e
			}
			res.Recorded++
			continue
		}
		workloads = append(workloads, *e)
	}
	if len(workloads) > 0 {
		ids := make([]string, len(workloads))
		// Configuration reports alone are a background write that
		// finishes a delivery: a fleet.configure's wave has every node
		// report at once (TxRoute.Background, TxRoute.Finishing).
		route := OnNodeFinishing
		for i, e := range workloads {
			ids[i] = e.ID
			if e.Kind != api.EventConfig {
				route = OnNode
			}
		}
		err := s.store.Tx(route(ctx, sess.NodeID), func(tx Tx) error {
			fresh, err := tx.RecordEventIDs(ctx, sess.NodeID, ids, now)
			if err != nil {
				return err
			}
			for _, e := range workloads {
				if !fresh[e.ID] {
					res.Duplicates++
					continue
				}
				delete(fresh, e.ID) // an id twice in one batch counts once
				res.Recorded++
				if e.Kind == api.EventConfig {
					if err := s.recordConfigReportTx(ctx, tx, sess, e, now); err != nil {
						return err
					}
					continue
				}
				w := e.Workload
				if err := tx.UpsertWorkload(ctx, Workload{NodeID: sess.NodeID, RunID: w.RunID, AttemptID: w.AttemptID,
					State: w.State, ExitCode: w.ExitCode, ObservedAt: w.ObservedAt.UTC(), ReceivedAt: now}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return EventsResult{}, err
		}
	}
	if beat != nil {
		r := LeaseRenewal{NodeID: sess.NodeID, Until: now.Add(s.settings.Lease), HeartbeatAt: &now}
		if beat.Facts != nil {
			b, disk, err := encodeFacts(*beat.Facts, now)
			if err != nil {
				return EventsResult{}, err
			}
			// A changed capability list (an agent replaced in place) is
			// announced with the write, so every replica's node cache
			// (the delivery check) forgets the old one (cache.go).
			r.Facts = &FactsUpdate{JSON: b, AgentVersion: beat.Facts.AgentVersion, ObservedAt: beat.Facts.ObservedAt.UTC(),
				ReceivedAt: now, Disk: disk, Announce: s.capabilitiesChanged(ctx, sess.NodeID, beat.Facts.Capabilities)}
		}
		if err := s.leases.heartbeat(ctx, r); err != nil {
			return EventsResult{}, err
		}
	}
	return res, nil
}
