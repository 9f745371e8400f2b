// Package metrics declares every Prometheus collector the control plane
// exports, in one registry per server so tests can run several servers in one
// process and read each one's counters.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is one server's collectors.
type Metrics struct {
	Registry *prometheus.Registry

	HTTPRequests *prometheus.CounterVec
	HTTPDuration *prometheus.HistogramVec

	// Delivery.
	OpenLongPolls     prometheus.Gauge
	PendingCommands   prometheus.GaugeFunc
	DeliveryLatency   prometheus.Histogram
	Redeliveries      prometheus.Counter
	Wakeups           *prometheus.CounterVec
	PollStoreQueries  prometheus.Counter
	CommandsIssued    prometheus.Counter
	CommandsSettled   *prometheus.CounterVec
	LeaseSweeps       prometheus.Counter
	NodesMarkedLost   prometheus.Counter
	HeartbeatsFlushed prometheus.Counter
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
		Wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_long_poll_wakeups_total", Help: "Long-poll wake-ups by source: local, notify, poll.",
		}, []string{"source"}),
		PollStoreQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_long_poll_store_queries_total", Help: "Store queries made by long-polls (one per check for work).",
		}),
		CommandsIssued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeward_commands_issued_total", Help: "Commands recorded for delivery.",
		}),
		CommandsSettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeward_commands_settled_total", Help: "Commands settled by state.",
		}, []string{"state"}),
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
	m.Wakeups.WithLabelValues("local")
	m.Wakeups.WithLabelValues("notify")
	m.Wakeups.WithLabelValues("poll")
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.HTTPRequests, m.HTTPDuration, m.OpenLongPolls, m.PendingCommands, m.DeliveryLatency,
		m.Redeliveries, m.Wakeups, m.PollStoreQueries, m.CommandsIssued, m.CommandsSettled,
		m.LeaseSweeps, m.NodesMarkedLost, m.HeartbeatsFlushed,
	)
	return m
}
