package metrics

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector turns the Sources' snapshots into metrics at each scrape, the way an
// exporter reads a server's stats: nothing is kept between scrapes.
type stateCollector struct {
	src     Sources
	maxTags int

	segTags, segRemaining, segNextReady, segStep       *prometheus.Desc
	segLoads, segLoadErrors, segLoadSeconds, segLastLd *prometheus.Desc

	sfWorker, sfLease, sfRecord, sfOffset, sfBorrowed, sfRefused *prometheus.Desc

	poolReady, poolDepth, poolIDs *prometheus.Desc

	natsConns, natsJSUsed, natsJSLimit *prometheus.Desc

	faults, inFault, recoveryLast, recoveryMax *prometheus.Desc

	monoTags, monoRole, monoLeases, monoForwarded, monoForwardErrs, monoForwardMsgs, monoRefused *prometheus.Desc
	deployProblem, deployRefusals                                                                *prometheus.Desc
}

func newStateCollector(src Sources, maxTags int) *stateCollector {
	d := prometheus.NewDesc
	tag := []string{"tag"}
	pool := []string{"kind", "tag", "pool"}
	storage := []string{"storage"}
	return &stateCollector{
		src:     src,
		maxTags: maxTags,

		segTags:        d("leafbus_segment_tags", "Segment tags this dispenser holds a buffer for.", nil, nil),
		segRemaining:   d("leafbus_segment_remaining_ids", "IDs left in the tag's current segment.", tag, nil),
		segNextReady:   d("leafbus_segment_next_ready", "1 when the tag's next segment is loaded and waiting (Leaf's nextReady).", tag, nil),
		segStep:        d("leafbus_segment_step_ids", "The step of the tag's last load (Leaf's dynamic step), in IDs.", tag, nil),
		segLoads:       d("leafbus_segment_store_loads_total", "Segments taken from the store.", tag, nil),
		segLoadErrors:  d("leafbus_segment_store_load_errors_total", "Store calls of segment loads that failed (each is retried).", tag, nil),
		segLoadSeconds: d("leafbus_segment_store_load_duration_seconds", "Time spent in store calls of segment loads; count is loads plus failed calls.", tag, nil),
		segLastLd:      d("leafbus_segment_last_load_timestamp_seconds", "When the tag's last segment arrived, Unix time.", tag, nil),

		sfWorker:   d("leafbus_snowflake_worker_id", "This node's snowflake worker ID, labelled with the registry it came from.", []string{"registry"}, nil),
		sfLease:    d("leafbus_snowflake_lease_state", "1 for the worker-ID lease's current state (held, suspended, lost), 0 for the others.", []string{"state"}, nil),
		sfRecord:   d("leafbus_snowflake_clock_record_timestamp_seconds", "The last clock record written (the highest timestamp vouched for), Unix time.", nil, nil),
		sfOffset:   d("leafbus_snowflake_clock_offset_seconds", "How far the clock reads behind the highest reading seen (a step back); 0 normally.", nil, nil),
		sfBorrowed: d("leafbus_snowflake_borrowed_seconds", "How far the highest timestamp issued is ahead of the clock.", nil, nil),
		sfRefused:  d("leafbus_snowflake_refusals_total", "Snowflake requests the generator refused (clock behind, suspended, ...).", nil, nil),

		poolReady: d("leafbus_pool_ready_batches", "Batches ready in a pre-filled pool.", pool, nil),
		poolDepth: d("leafbus_pool_depth_batches", "The most batches a pool keeps ready.", pool, nil),
		poolIDs:   d("leafbus_pool_prepared_ids", "IDs prepared in a pool's ready batches.", pool, nil),

		natsConns:   d("leafbus_nats_connections", "Client connections of the embedded NATS server.", nil, nil),
		natsJSUsed:  d("leafbus_nats_jetstream_used_bytes", "JetStream storage in use on the embedded server.", storage, nil),
		natsJSLimit: d("leafbus_nats_jetstream_limit_bytes", "JetStream storage reserved on the embedded server.", storage, nil),

		faults:       d("leafbus_faults_total", "Faults seen since start: a dependency down (NATS, ZooKeeper) or snowflake IDs not served.", nil, nil),
		inFault:      d("leafbus_fault_active", "1 while a fault lasts: not serving fully.", nil, nil),
		recoveryLast: d("leafbus_recovery_last_seconds", "The last fault's time from its end (the dependency back) to full service.", nil, nil),
		recoveryMax:  d("leafbus_recovery_max_seconds", "The longest time from a fault's end to full service since start.", nil, nil),

		monoTags:        d("leafbus_monotonic_tags", "Monotonic tags this dispenser knows of.", nil, nil),
		monoRole:        d("leafbus_monotonic_role", "1 for this dispenser's role for the monotonic tag (leader, starting, follower, none: no leader known, requests get 503), 0 for the others; for tag=\"_other\", how many of the tags beyond --metrics-max-tags have that role.", []string{"tag", "role"}, nil),
		monoLeases:      d("leafbus_monotonic_leases_total", "Leases this dispenser took for the monotonic tag (its terms as leader).", tag, nil),
		monoForwarded:   d("leafbus_monotonic_forwarded_requests_total", "Requests for the monotonic tag forwarded to its leader and answered.", tag, nil),
		monoForwardErrs: d("leafbus_monotonic_forward_errors_total", "Requests for the monotonic tag forwarded to its leader and refused or unanswered.", tag, nil),
		monoForwardMsgs: d("leafbus_monotonic_forward_messages_total", "Messages to the monotonic tag's leader that carried the forwarded requests.", tag, nil),
		deployProblem:   d("leafbus_deployment_record_problem", "1 while the deployment record contradicts this running dispenser, is gone, unreadable, or names a tag range it refused (the status page and /readyz say what); it serves on under the record it started with.", nil, nil),
		deployRefusals:  d("leafbus_deployment_record_refusals_total", "Deployment records this dispenser refused or wrote back (gone, unreadable, or a change it contradicts) since start.", nil, nil),
		monoRefused:     d("leafbus_monotonic_refused_replies_total", "Forwarded requests a leader refused because their reply subject was not an inbox.", nil, nil),
	}
}

// Describe sends every desc, so the registry checks the collector like any other.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.segTags, c.segRemaining, c.segNextReady, c.segStep,
		c.segLoads, c.segLoadErrors, c.segLoadSeconds, c.segLastLd,
		c.sfWorker, c.sfLease, c.sfRecord, c.sfOffset, c.sfBorrowed, c.sfRefused,
		c.poolReady, c.poolDepth, c.poolIDs,
		c.natsConns, c.natsJSUsed, c.natsJSLimit,
		c.faults, c.inFault, c.recoveryLast, c.recoveryMax,
		c.monoTags, c.monoRole, c.monoLeases, c.monoForwarded, c.monoForwardErrs, c.monoForwardMsgs, c.monoRefused,
		c.deployProblem, c.deployRefusals,
	} {
		ch <- d
	}
}

// Collect reads each source once.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.src.SegmentTags != nil {
		c.collectSegments(ch, c.src.SegmentTags())
	}
	if c.src.Snowflake != nil {
		if s, ok := c.src.Snowflake(); ok {
			c.collectSnowflake(ch, s)
		}
	}
	if c.src.Pools != nil {
		c.collectPools(ch, c.src.Pools())
	}
	if c.src.NATS != nil {
		c.collectNATS(ch, c.src.NATS())
	}
	if c.src.Recovery != nil {
		r := c.src.Recovery()
		ch <- counter(c.faults, float64(r.Faults))
		ch <- gauge(c.inFault, boolFloat(r.InFault))
		ch <- gauge(c.recoveryLast, r.Last.Seconds())
		ch <- gauge(c.recoveryMax, r.Max.Seconds())
	}
	if c.src.Monotonic != nil {
		c.collectMonotonic(ch, c.src.Monotonic())
	}
	if c.src.Deployment != nil {
		dep := c.src.Deployment()
		ch <- gauge(c.deployProblem, boolFloat(dep.Problem))
		ch <- counter(c.deployRefusals, float64(dep.Refusals))
	}
}

func (c *stateCollector) collectSegments(ch chan<- prometheus.Metric, tags []SegmentTag) {
	ch <- prometheus.MustNewConstMetric(c.segTags, prometheus.GaugeValue, float64(len(tags)))
	top, rest := Busiest(tags, c.maxTags)
	for _, t := range top {
		c.collectTag(ch, t, boolFloat(t.NextReady))
	}
	if len(rest) > 0 {
		other, ready := Sum(OtherTag, rest)
		c.collectTag(ch, other, float64(ready))
	}
}

func (c *stateCollector) collectTag(ch chan<- prometheus.Metric, t SegmentTag, nextReady float64) {
	ch <- gauge(c.segRemaining, float64(t.Current.Remaining()), t.Tag)
	ch <- gauge(c.segNextReady, nextReady, t.Tag)
	ch <- gauge(c.segStep, float64(t.Step), t.Tag)
	ch <- counter(c.segLoads, float64(t.Loads), t.Tag)
	ch <- counter(c.segLoadErrors, float64(t.LoadErrors), t.Tag)
	ch <- prometheus.MustNewConstSummary(c.segLoadSeconds, t.Loads+t.LoadErrors, t.LoadSeconds, nil, t.Tag)
	if !t.LastLoad.IsZero() {
		ch <- gauge(c.segLastLd, float64(t.LastLoad.UnixMilli())/1e3, t.Tag)
	}
}

// Busiest splits tags into the at most maxTags with the most IDs issued (ties by
// name), in that order, and the rest. A tag that is itself named OtherTag always goes
// to the rest, so that its series cannot collide with the sum of the rest.
func Busiest(tags []SegmentTag, maxTags int) (top, rest []SegmentTag) {
	sorted := slices.Clone(tags)
	slices.SortFunc(sorted, func(a, b SegmentTag) int {
		if c := cmp.Compare(b.Issued, a.Issued); c != 0 {
			return c
		}
		return cmp.Compare(a.Tag, b.Tag)
	})
	for _, t := range sorted {
		if t.Tag != OtherTag && len(top) < maxTags {
			top = append(top, t)
		} else {
			rest = append(rest, t)
		}
	}
	return top, rest
}

// Sum adds tags up into one SegmentTag called name: its remaining IDs, steps and counts
// are totals and its LastLoad the latest; ready is how many of them have their next
// segment ready (the sum's NextReady is true when any has).
func Sum(name string, tags []SegmentTag) (sum SegmentTag, ready int) {
	sum.Tag = name
	for _, t := range tags {
		sum.Current.Value += t.Current.Value
		sum.Current.Max += t.Current.Max
		sum.Current.Step += t.Current.Step
		if t.NextReady {
			ready++
		}
		sum.Step += t.Step
		sum.Issued += t.Issued
		sum.Loads += t.Loads
		sum.LoadErrors += t.LoadErrors
		sum.LoadSeconds += t.LoadSeconds
		if t.LastLoad.After(sum.LastLoad) {
			sum.LastLoad = t.LastLoad
		}
	}
	sum.NextReady = ready > 0
	return sum, ready
}

func (c *stateCollector) collectSnowflake(ch chan<- prometheus.Metric, s Snowflake) {
	ch <- gauge(c.sfWorker, float64(s.WorkerID), s.Registry)
	for _, state := range LeaseStates {
		ch <- gauge(c.sfLease, boolFloat(s.Lease == state), state)
	}
	ch <- gauge(c.sfRecord, float64(s.Record)/1e3)
	ch <- gauge(c.sfOffset, s.Offset.Seconds())
	ch <- gauge(c.sfBorrowed, s.Borrowed.Seconds())
	ch <- counter(c.sfRefused, float64(s.Refused))
}

func (c *stateCollector) collectPools(ch chan<- prometheus.Metric, pools []Pool) {
	for _, p := range pools {
		ch <- gauge(c.poolReady, float64(p.Ready), p.Kind, p.Tag, p.Where)
		ch <- gauge(c.poolDepth, float64(p.Depth), p.Kind, p.Tag, p.Where)
		ch <- gauge(c.poolIDs, float64(p.Ready)*float64(p.Size), p.Kind, p.Tag, p.Where)
	}
}

// collectMonotonic shows the first maxTags monotonic tags by name (an operator marks
// them, so they are few and the set is stable) and sums the rest under OtherTag, whose
// role series count the tags in each role.
func (c *stateCollector) collectMonotonic(ch chan<- prometheus.Metric, m Monotonic) {
	ch <- gauge(c.monoTags, float64(len(m.Tags)))
	ch <- counter(c.monoRefused, float64(m.RefusedReplies))
	tags := slices.SortedFunc(slices.Values(m.Tags), func(a, b MonotonicTag) int { return cmp.Compare(a.Tag, b.Tag) })
	other := MonotonicTag{Tag: OtherTag}
	roles := map[string]int{}
	shown := 0
	for _, t := range tags {
		if t.Tag != OtherTag && shown < c.maxTags {
			shown++
			for _, role := range MonotonicRoles {
				ch <- gauge(c.monoRole, boolFloat(t.Role == role), t.Tag, role)
			}
			c.collectMonotonicCounts(ch, t)
			continue
		}
		roles[t.Role]++
		other.Terms += t.Terms
		other.Forwarded += t.Forwarded
		other.ForwardErrors += t.ForwardErrors
		other.ForwardMessages += t.ForwardMessages
	}
	if shown < len(tags) {
		for _, role := range MonotonicRoles {
			ch <- gauge(c.monoRole, float64(roles[role]), OtherTag, role)
		}
		c.collectMonotonicCounts(ch, other)
	}
}

func (c *stateCollector) collectMonotonicCounts(ch chan<- prometheus.Metric, t MonotonicTag) {
	ch <- counter(c.monoLeases, float64(t.Terms), t.Tag)
	ch <- counter(c.monoForwarded, float64(t.Forwarded), t.Tag)
	ch <- counter(c.monoForwardErrs, float64(t.ForwardErrors), t.Tag)
	ch <- counter(c.monoForwardMsgs, float64(t.ForwardMessages), t.Tag)
}

func (c *stateCollector) collectNATS(ch chan<- prometheus.Metric, n NATSServer) {
	ch <- gauge(c.natsConns, float64(n.Connections))
	ch <- gauge(c.natsJSUsed, float64(n.JetStreamMemory), "memory")
	ch <- gauge(c.natsJSUsed, float64(n.JetStreamStore), "file")
	ch <- gauge(c.natsJSLimit, float64(n.JetStreamMaxMemory), "memory")
	ch <- gauge(c.natsJSLimit, float64(n.JetStreamMaxStore), "file")
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
