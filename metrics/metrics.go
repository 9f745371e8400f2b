// Package metrics declares every Prometheus collector the control plane
// exports, in one registry per server so tests can run several servers in one
// process and read each one's counters.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// StoreReadInterval is the least time between two reads of the fleet-wide
// counts /metrics exports from the shared database (nodeward_operations,
// nodeward_config_lagging_nodes). Each is a count that grows with the open
// operations or the lagging nodes — 74 ms of Postgres apiece with 10,000
// of a fleet.configure's children open (BENCHMARKS.md, thirty-eighth
// sitting) — /metrics answers whoever reaches it, and every replica
// exports the same figures. A scrape within the interval answers the last
// read's figures, and scrapes at the same moment share one read, so no
// scraper can make a replica read them more often.
const StoreReadInterval = 5 * time.Second

// Metrics is one server's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	HTTPRequests *prometheus.CounterVec
	HTTPDuration *prometheus.HistogramVec

	// Delivery.
	OpenLongPolls    prometheus.Gauge
	PendingCommands  prometheus.GaugeFunc
	DeliveryLatency  prometheus.Histogram
	Redeliveries     prometheus.Counter
	PollResumes      prometheus.Counter
	Wakeups          *prometheus.CounterVec
	PollStoreQueries prometheus.Counter
	PollReadsSkipped prometheus.Counter
	PollDirectClaims prometheus.Counter
	PollHandoffs     prometheus.Counter
	PeerResyncs      prometheus.Counter
	ReplicaPeers     prometheus.Gauge
	NodeLookups      *prometheus.CounterVec
	NodesWarmed      prometheus.Counter
	// SessionVerifications counts agent session tokens accepted by their
	// signature or by the replica's memory of having verified them.
	SessionVerifications     *prometheus.CounterVec
	PollRenewals             prometheus.Counter
	CommandsIssued           prometheus.Counter
	CommandsSettled          *prometheus.CounterVec
	EnrollmentsShed          prometheus.Counter
	EnrollmentsAnsweredAgain prometheus.Counter
	LeaseSweeps              prometheus.Counter
	NodesMarkedLost          prometheus.Counter
	HeartbeatsFlushed        prometheus.Counter

	// Ledger.
	OperationsSubmitted *prometheus.CounterVec
	OperationsEnded     *prometheus.CounterVec
	OperationsRunning   prometheus.Gauge
	DispatchLatency     prometheus.Histogram
	ExecutorRunTime     *prometheus.HistogramVec
	LedgerClaims        prometheus.Counter
	LedgerWakeups       *prometheus.CounterVec
	OperationsRecovered *prometheus.CounterVec
	// FanOutChildEnds counts the notices that a fan-out's child ended (or
	// that its parent otherwise needs moving on); FanOutAdvances the
	// advances they and the sweep caused, coalesced (ledger/advance.go).
	FanOutChildEnds prometheus.Counter
	FanOutAdvances  *prometheus.CounterVec
	// OperationStates is read at scrape time, at most once per
	// StoreReadInterval: operations by state across replicas (pending is
	// the queue depth); false when the store could not answer. Wiring sets
	// it.
	OperationStates func() (map[string]float64, bool)
	// CredentialCache is read at scrape time: this replica's credential
	// cache counters. Wiring sets it.
	CredentialCache func() CredentialCacheCounts

	// Desired configuration.
	ConfigRevisions  prometheus.Counter
	ConfigDeliveries prometheus.Counter
	ConfigReports    *prometheus.CounterVec

	// TablesMaintained counts VACUUMs and ANALYZEs the server ran itself
	// (Postgres with autovacuum off), by table and action.
	TablesMaintained *prometheus.CounterVec
	// ConfigLagging is read at scrape time, at most once per
	// StoreReadInterval: nodes whose applied revision is behind the
	// desired one. Wiring sets it.
	ConfigLagging func() (float64, bool)

	// Now is the clock of the store reads' interval (nil: time.Now).
	Now func() time.Time

	operationStatesRead storeRead[map[string]float64]
	configLaggingRead   storeRead[float64]
}

// storeRead is the last answer of a scrape-time read of the store, kept
// for StoreReadInterval.
type storeRead[T any] struct {
	mu   sync.Mutex // held through a read, so concurrent scrapes share it
	at   time.Time
	have bool
	val  T
}

// get answers the value read within the interval before now, else reads
// it again; a read that fails is not kept.
func (r *storeRead[T]) get(now time.Time, read func() (T, bool)) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.have && now.Sub(r.at) < StoreReadInterval {
		return r.val, true
	}
	v, ok := read()
	if ok {
		r.val, r.at, r.have = v, now, true
	}
	return v, ok
}

func (m *Metrics) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// New builds the collectors and registers them, plus the Go and process
// collectors, on a fresh registry. pending reports the count of pending
// commands when scraped (nil reports zero).
func New(pending func() float64) *Metrics {
	if pending == nil {
		pending = func() float64 { return 0 }
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_http_requests_total", Help: "HTTP requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		HTTPDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nodeward_http_request_duration_seconds", Help: "HTTP request duration by route pattern (long-polls included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"route"}),
		OpenLongPolls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeward_open_long_polls", Help: "Agent long-polls held by this replica now.",
		}),
		PendingCommands: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeward_pending_commands", Help: "Commands recorded and not yet settled (all replicas).",
		}, pending),
		DeliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nodeward_command_delivery_latency_seconds", Help: "Time from a command's issue to its first delivery.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		Redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_command_redeliveries_total", Help: "Commands delivered again after an earlier delivery.",
		}),
		PollResumes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_resumes_total", Help: "Long-polls that asked for work delivered before them again (resume=true: the agent may have lost an answer).",
		}),
		Wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_long_poll_wakeups_total", Help: "Long-poll wake-ups by source: local, notify, poll.",
		}, []string{"source"}),
		PollStoreQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_store_queries_total", Help: "Store queries made by long-polls (one per check for work).",
		}),
		PollReadsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_due_reads_skipped_total", Help: "Long-poll checks for work answered without a store query: this replica's last read found nothing due for the node and nothing was announced for it since.",
		}),
		PollDirectClaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_direct_claims_total", Help: "Long-poll checks for work that claimed without a read first: woken by a command this replica had just recorded for the node.",
		}),
		PollHandoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_handoffs_total", Help: "Long-polls answered with commands claimed for them by the transaction that recorded the commands (the poll ran no claim of its own).",
		}),
		PeerResyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_peer_resyncs_total", Help: "Times this replica dropped what it knew of the nodes and woke every long-poll because another replica's heartbeat lapsed or it restarted: what that replica committed but had not yet announced is read instead.",
		}),
		ReplicaPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeward_replica_peers", Help: "Other replicas this one counted at its last look (Postgres, every 5 s): a heartbeat in the last 15 s. While it is 0 and no replica greeted this one in that time, this replica sends none of the notifications that only wake the others.",
		}),
		NodeLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_node_lookups_total", Help: "Node records (fencing token, retired, capabilities) the agent doors and capability checks needed, answered from this replica's node cache (result=hit) or by a database read (result=store).",
		}, []string{"result"}),
		NodesWarmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_node_cache_warmed_nodes_total", Help: "Nodes read in pages to fill this replica's node cache and due-work memo at start and whenever cross-replica notifications come back, so agents redialing at once do not each cost a read.",
		}),
		SessionVerifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_session_verifications_total", Help: "Agent session tokens checked by their signature (result=signature) or answered from this replica's memory of tokens it already verified (result=cached: expiry and key still checked); either way the node's record is checked after.",
		}, []string{"result"}),
		PollRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_lease_renewals_total", Help: "Lease renewals queued by arriving long-polls (written in coalesced batches; counted in nodeward_lease_renewals_flushed_total too).",
		}),
		CommandsIssued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_commands_issued_total", Help: "Commands recorded for delivery.",
		}),
		CommandsSettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_commands_settled_total", Help: "Commands settled by state.",
		}, []string{"state"}),
		EnrollmentsShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_enrollments_shed_total", Help: "Enrollments answered 503 overloaded, unredeemed, because they waited longer than the enrollment queue bound for their turn to write.",
		}),
		EnrollmentsAnsweredAgain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_enrollments_answered_again_total", Help: "Enrollments retried by the agent that redeemed the token (same nonce, within the retry window) and answered again at the same fencing token.",
		}),
		LeaseSweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_lease_sweeps_total", Help: "Lease sweeps run by this replica.",
		}),
		NodesMarkedLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_nodes_marked_lost_total", Help: "Ready nodes marked lost after their lease lapsed.",
		}),
		HeartbeatsFlushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_lease_renewals_flushed_total", Help: "Coalesced lease renewals written to the store.",
		}),
	}
	m.OperationsSubmitted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_operations_submitted_total", Help: "Operations recorded by kind.",
	}, []string{"kind"})
	m.OperationsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_operations_ended_total", Help: "Operations ended by this replica, by kind and final state.",
	}, []string{"kind", "state"})
	m.OperationsRunning = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodeward_operations_executing", Help: "Local operations this replica's executors run now.",
	})
	m.DispatchLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "nodeward_operation_dispatch_latency_seconds", Help: "Time from an operation's submit to its claim by an executor.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	m.ExecutorRunTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "nodeward_operation_run_seconds", Help: "Executor run time by kind.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 12),
	}, []string{"kind"})
	m.LedgerClaims = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeward_operation_claims_total", Help: "Claim statements the dispatcher ran.",
	})
	m.LedgerWakeups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_dispatcher_wakeups_total", Help: "Dispatcher wake-ups by source: wake (a submit or an end), poll (fallback).",
	}, []string{"source"})
	m.OperationsRecovered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_operations_recovered_total", Help: "Operations left running by a gone replica, by what recovery did: rerun, interrupted.",
	}, []string{"action"})
	m.FanOutChildEnds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeward_fanout_child_end_notices_total", Help: "Notices that a fan-out parent's child ended, before coalescing.",
	})
	m.FanOutAdvances = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_fanout_advances_total", Help: "Fan-out parent advances by source: prompt (at once), interval (put off to coalesce ends), sweep (periodic), continued (the next batch of held children).",
	}, []string{"source"})
	m.ConfigRevisions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeward_config_revisions_total", Help: "Desired configuration revisions written (a changed document).",
	})
	m.ConfigDeliveries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeward_config_deliveries_total", Help: "Desired configurations carried in long-poll answers.",
	})
	m.ConfigReports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_config_reports_total", Help: "Configuration reports recorded, by verdict.",
	}, []string{"verdict"})
	m.TablesMaintained = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeward_db_table_maintenance_total", Help: "VACUUM (ANALYZE) and ANALYZE runs this replica made on its tables, by table and action (vacuum, analyze): analyze for a table that outgrew its planner statistics, both at autovacuum's thresholds while Postgres's autovacuum is off.",
	}, []string{"table", "action"})
	m.Wakeups.WithLabelValues("local")
	m.Wakeups.WithLabelValues("notify")
	m.Wakeups.WithLabelValues("poll")
	for _, source := range []string{"prompt", "interval", "sweep", "continued"} {
		m.FanOutAdvances.WithLabelValues(source)
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.HTTPRequests, m.HTTPDuration, m.OpenLongPolls, m.PendingCommands, m.DeliveryLatency,
		m.Redeliveries, m.PollResumes, m.Wakeups, m.PollStoreQueries, m.PollReadsSkipped, m.PollDirectClaims, m.PollHandoffs, m.PeerResyncs, m.ReplicaPeers, m.NodeLookups, m.NodesWarmed, m.SessionVerifications, m.PollRenewals, m.CommandsIssued, m.CommandsSettled, m.EnrollmentsShed, m.EnrollmentsAnsweredAgain,
		m.LeaseSweeps, m.NodesMarkedLost, m.HeartbeatsFlushed,
		m.OperationsSubmitted, m.OperationsEnded, m.OperationsRunning, m.DispatchLatency, m.ExecutorRunTime,
		m.LedgerClaims, m.LedgerWakeups, m.OperationsRecovered, operationStates{m},
		m.FanOutChildEnds, m.FanOutAdvances,
		m.ConfigRevisions, m.ConfigDeliveries, m.ConfigReports, configLagging{m},
		credentialCache{m}, m.TablesMaintained,
	)
	return m
}

// operationStates exports nodeward_operations{state} from the store when
// scraped, so every replica reports the shared ledger's figures.
type operationStates struct{ m *Metrics }

var operationStatesDesc = prometheus.NewDesc("nodeward_operations",
	"Open operations by state (pending: the queue depth; running) across replicas, read from the database at most every 5 s; ended ones are counted per replica by nodeward_operations_ended_total.", []string{"state"}, nil)

func (c operationStates) Describe(ch chan<- *prometheus.Desc) { ch <- operationStatesDesc }

func (c operationStates) Collect(ch chan<- prometheus.Metric) {
	if c.m.OperationStates == nil {
		return
	}
	states, ok := c.m.operationStatesRead.get(c.m.now(), c.m.OperationStates)
	if !ok {
		return
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(operationStatesDesc, prometheus.GaugeValue, n, state)
	}
}

// configLagging exports nodeward_config_lagging_nodes from the store when
// scraped (a count over a partial index, not a scan of every node).
type configLagging struct{ m *Metrics }

var configLaggingDesc = prometheus.NewDesc("nodeward_config_lagging_nodes",
	"Nodes that reported a configuration and whose applied revision is behind the desired one (read from the database at most every 5 s).", nil, nil)

func (c configLagging) Describe(ch chan<- *prometheus.Desc) { ch <- configLaggingDesc }

func (c configLagging) Collect(ch chan<- prometheus.Metric) {
	if c.m.ConfigLagging == nil {
		return
	}
	if n, ok := c.m.configLaggingRead.get(c.m.now(), c.m.ConfigLagging); ok {
		ch <- prometheus.MustNewConstMetric(configLaggingDesc, prometheus.GaugeValue, n)
	}
}

// CredentialCacheCounts are the administrators' credential cache counters
// (auth.CacheStats).
type CredentialCacheCounts struct {
	Hits, StoreReads int64
	// Shared are authentications answered by a concurrent request's read.
	Shared int64
	// Invalidations by source: local, notify, resync.
	Invalidations map[string]int64
}

// credentialCache exports nodeward_credential_lookups_total{result} and
// nodeward_credential_cache_invalidations_total{source} when scraped.
type credentialCache struct{ m *Metrics }

var (
	credentialLookupsDesc = prometheus.NewDesc("nodeward_credential_lookups_total",
		"API authentications (API tokens, package host tokens, console sessions) answered from this replica's cache (result=hit), by a database read (result=store), or by a concurrent request's read of the same credential (result=shared).", []string{"result"}, nil)
	credentialInvalidationsDesc = prometheus.NewDesc("nodeward_credential_cache_invalidations_total",
		"Revocations applied to the credential cache: by this replica's commit (local), another replica's notification (notify), or the whole cache dropped because notifications may have been missed (resync).", []string{"source"}, nil)
)

func (c credentialCache) Describe(ch chan<- *prometheus.Desc) {
	ch <- credentialLookupsDesc
	ch <- credentialInvalidationsDesc
}

func (c credentialCache) Collect(ch chan<- prometheus.Metric) {
	if c.m.CredentialCache == nil {
		return
	}
	st := c.m.CredentialCache()
	ch <- prometheus.MustNewConstMetric(credentialLookupsDesc, prometheus.CounterValue, float64(st.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(credentialLookupsDesc, prometheus.CounterValue, float64(st.StoreReads), "store")
	ch <- prometheus.MustNewConstMetric(credentialLookupsDesc, prometheus.CounterValue, float64(st.Shared), "shared")
	for src, n := range st.Invalidations {
		ch <- prometheus.MustNewConstMetric(credentialInvalidationsDesc, prometheus.CounterValue, float64(n), src)
	}
}
