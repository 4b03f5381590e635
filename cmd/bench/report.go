package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leafbus/leafbus/client"
)

// Report is everything a run measured; --json prints it as is. Latencies are in
// microseconds, rates per second, IDs as strings (they exceed 2^53).
type Report struct {
	Transport   string   `json:"transport"` // "nats", or "http" with --http
	Target      string   `json:"target"`    // the NATS URLs or the HTTP base URL, credentials removed
	Kind        string   `json:"kind"`
	Tags        []string `json:"tags"`
	Batch       int      `json:"batch"`
	Encoding    string   `json:"encoding"`
	Mode        string   `json:"mode"` // "closed" or "open"
	Clients     int      `json:"clients"`
	Inflight    int      `json:"inflight,omitempty"` // closed loop
	Rate        float64  `json:"rate,omitempty"`     // open loop
	Requests    int64    `json:"requests,omitempty"` // the --requests limit
	WarmupS     float64  `json:"warmup_s"`
	DurationS   float64  `json:"duration_s,omitempty"` // the --duration limit
	TimeoutS    float64  `json:"timeout_s"`
	Interrupted bool     `json:"interrupted"` // stopped by a signal before its end

	Dispenser PhaseReport     `json:"dispenser"`
	Check     *CheckReport    `json:"check,omitempty"`
	Baseline  *BaselineReport `json:"baseline,omitempty"` // echo in this process
	// BaselineProcess is the echo in a process of its own (--baseline echo-process).
	BaselineProcess *BaselineReport `json:"baseline_process,omitempty"`
}

// PhaseReport is one phase: the dispenser run or the echo run. Counts are of measured
// requests (after the warm-up) unless said otherwise.
type PhaseReport struct {
	ElapsedS        float64             `json:"elapsed_s"` // end of warm-up to the last measured completion
	Sent            int64               `json:"sent"`
	OK              int64               `json:"ok"`
	IDs             int64               `json:"ids"`
	RequestsPerS    float64             `json:"requests_per_s"` // good replies per second
	IDsPerS         float64             `json:"ids_per_s"`
	Errors          map[string]int64    `json:"errors"`                  // by Nats-Service-Error-Code, no_responders, timeout, bad_reply, send
	ErrorSamples    map[string][]string `json:"error_samples,omitempty"` // a few messages per key, warm-up included
	LateReplies     int64               `json:"late_replies"`            // arrived after being counted as a timeout
	OrderViolations int64               `json:"order_violations"`        // replies with IDs not strictly increasing, warm-up included
	SlowConsumer    int64               `json:"slow_consumer_events"`    // replies nats.go dropped in this client
	Latency         Latency             `json:"latency_us"`              // of the good replies
	// CPU is the CPU time (user + system) each watched process used per good reply after
	// the warm-up, in µs: "bench", "echo-process" and the --cpu-pid labels (Linux only).
	CPU map[string]float64 `json:"cpu_us_per_request,omitempty"`
	// SendLag (open loop) is how late the bench published requests against its
	// timetable. It is inside Latency by design; when it is large the bench, not the
	// server, is the bottleneck: add clients or CPU.
	SendLag *Latency `json:"send_lag_us,omitempty"`
}

// Latency summarises the histogram, in microseconds.
type Latency struct {
	Count uint64  `json:"count"`
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
}

// CheckReport is what --check found over every ID received, warm-up included.
type CheckReport struct {
	IDs              int64    `json:"ids"`
	Duplicates       int64    `json:"duplicates"` // extra receipts of an ID already seen
	DuplicateSamples []string `json:"duplicate_samples"`
	// Regressions counts segment replies whose first ID is not above the previous reply's
	// last ID for the same client and tag. PROTOCOL.md only promises trend-increasing IDs
	// across replies, so this is information, not a failure. Absent for snowflake.
	Regressions *int64 `json:"regressions,omitempty"`
	SpilledRuns int    `json:"spilled_runs"`
}

// BaselineReport is the echo comparison.
type BaselineReport struct {
	Where            string        `json:"where"` // "in-process" or "own process"
	Responders       int           `json:"responders"`
	RespondersSource string        `json:"responders_source"`
	PayloadBytes     []int         `json:"payload_bytes"` // per tag
	Echo             *PhaseReport  `json:"echo,omitempty"`
	Ratios           []MetricRatio `json:"ratios,omitempty"`
	// RoundRatios is each round's dispenser/echo requests/s (--rounds; one entry
	// without), MedianRoundRatio their median.
	RoundRatios      []float64 `json:"round_ratios,omitempty"`
	MedianRoundRatio float64   `json:"median_round_ratio,omitempty"`
	Error            string    `json:"error,omitempty"` // why there is no comparison
}

// MetricRatio is one row of the comparison: dispenser/echo. Above 1 the dispenser has
// more throughput or more latency than bare NATS; Ratio is null when echo is 0.
type MetricRatio struct {
	Metric    string   `json:"metric"`
	Dispenser float64  `json:"dispenser"`
	Echo      float64  `json:"echo"`
	Ratio     *float64 `json:"ratio"`
}

// Failed reports a broken invariant: a duplicate ID, or IDs out of order in a reply.
func (r *Report) Failed() bool {
	return (r.Check != nil && r.Check.Duplicates > 0) || r.Dispenser.OrderViolations > 0
}

func newReport(cfg Config) *Report {
	r := &Report{
		Transport: "nats", Target: client.RedactURLs(cfg.Conn.URLs), Kind: cfg.Kind.String(), Tags: cfg.Tags, Batch: cfg.Batch,
		Encoding: cfg.Encoding.String(), Mode: "closed", Clients: cfg.Clients, Inflight: cfg.Inflight,
		Requests: cfg.Requests, WarmupS: cfg.Warmup.Seconds(), DurationS: cfg.Duration.Seconds(),
		TimeoutS: cfg.Timeout.Seconds(),
	}
	if cfg.Rate > 0 {
		r.Mode, r.Rate, r.Inflight = "open", cfg.Rate, 0
	}
	if cfg.HTTP != "" {
		r.Transport, r.Target = "http", client.RedactURLs(cfg.HTTP)
	}
	return r
}

func phaseReport(r *phaseResult) PhaseReport {
	p := PhaseReport{
		ElapsedS: r.elapsed.Seconds(), Sent: r.sent, OK: r.ok, IDs: r.ids,
		Errors: r.errors, LateReplies: r.late, OrderViolations: r.orderViolations,
		SlowConsumer: r.slowConsumers,
		Latency:      latency(r.hist),
		CPU:          r.cpu,
	}
	if r.sendLag != nil {
		l := latency(r.sendLag)
		p.SendLag = &l
	}
	if len(r.errorSamples) > 0 {
		p.ErrorSamples = r.errorSamples
	}
	if s := r.elapsed.Seconds(); s > 0 {
		p.RequestsPerS = float64(r.ok) / s
		p.IDsPerS = float64(r.ids) / s
	}
	return p
}

func latency(h *hist) Latency {
	return Latency{
		Count: h.Count(), Min: us(h.Min()), Mean: us(h.Mean()),
		P50: us(h.Percentile(50)), P90: us(h.Percentile(90)), P99: us(h.Percentile(99)),
		P999: us(h.Percentile(99.9)), Max: us(h.Max()),
	}
}

func checkReport(c checkResult, segment bool, regressions int64) *CheckReport {
	r := &CheckReport{IDs: c.IDs, Duplicates: c.Duplicates, DuplicateSamples: []string{}, SpilledRuns: c.Runs}
	for _, id := range c.Samples {
		r.DuplicateSamples = append(r.DuplicateSamples, strconv.FormatInt(id, 10))
	}
	if segment {
		r.Regressions = &regressions
	}
	return r
}

// ratios compares the two phases metric by metric.
func ratios(d, e *PhaseReport) []MetricRatio {
	rows := []MetricRatio{
		{Metric: "requests/s", Dispenser: d.RequestsPerS, Echo: e.RequestsPerS},
		{Metric: "IDs/s", Dispenser: d.IDsPerS, Echo: e.IDsPerS},
		{Metric: "p50 µs", Dispenser: d.Latency.P50, Echo: e.Latency.P50},
		{Metric: "p90 µs", Dispenser: d.Latency.P90, Echo: e.Latency.P90},
		{Metric: "p99 µs", Dispenser: d.Latency.P99, Echo: e.Latency.P99},
		{Metric: "p99.9 µs", Dispenser: d.Latency.P999, Echo: e.Latency.P999},
		{Metric: "max µs", Dispenser: d.Latency.Max, Echo: e.Latency.Max},
	}
	if cpuTotal(d.CPU) > 0 && cpuTotal(e.CPU) > 0 { // 0: too short for the 10 ms clock
		rows = append(rows, MetricRatio{Metric: "CPU µs/request", Dispenser: cpuTotal(d.CPU), Echo: cpuTotal(e.CPU)})
	}
	for i := range rows {
		if rows[i].Echo != 0 {
			r := rows[i].Dispenser / rows[i].Echo
			rows[i].Ratio = &r
		}
	}
	return rows
}

// cpuTotal is the CPU per request of every watched process together.
func cpuTotal(cpu map[string]float64) float64 {
	var sum float64
	for _, v := range cpu {
		sum += v
	}
	return sum
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// WriteJSON prints the report as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText prints the report as aligned tables for people: what was run, the table of
// the phases side by side, then the notes (error samples, check, baseline).
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	r.writeHeading(tw)
	r.writeTable(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	r.writeNotes(w)
	return nil
}

// writeHeading says what was run: kind, batch, encoding, tags, load, limits and target.
func (r *Report) writeHeading(w io.Writer) {
	mode := fmt.Sprintf("closed loop, %d clients x %d in flight", r.Clients, r.Inflight)
	if r.Mode == "open" {
		mode = fmt.Sprintf("open loop, %g requests/s over %d clients", r.Rate, r.Clients)
	}
	limit := "until interrupted"
	switch {
	case r.Requests > 0 && r.DurationS > 0:
		limit = fmt.Sprintf("%s requests or %gs", group(r.Requests), r.DurationS)
	case r.Requests > 0:
		limit = group(r.Requests) + " requests"
	case r.DurationS > 0:
		limit = fmt.Sprintf("%gs", r.DurationS)
	}
	fmt.Fprintf(w, "leafbus bench: %s IDs, batch %d, %s, tags %s\n", r.Kind, r.Batch, r.Encoding, strings.Join(r.Tags, ","))
	fmt.Fprintf(w, "%s; %s after %gs warm-up; timeout %gs; %s %s\n", mode, limit, r.WarmupS, r.TimeoutS, strings.ToUpper(r.Transport), r.Target)
	if r.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: the numbers cover the run until the signal")
	}
	fmt.Fprintln(w)
}

// phaseTable writes rows of one metric per phase, then for each baseline the ratio.
type phaseTable struct {
	w      io.Writer
	phases []*PhaseReport
	ratios [][]MetricRatio // per baseline (phases[1:])
}

// row writes the metric name, f of each phase, and with baselines the ratios of the
// comparison's metric ("": none).
func (t *phaseTable) row(name string, f func(p *PhaseReport) string, metric string) {
	line := name
	for _, p := range t.phases {
		line += "\t" + f(p)
	}
	for _, rs := range t.ratios {
		line += "\t" + ratioString(findRatio(rs, metric))
	}
	fmt.Fprintln(t.w, line+"\t")
}

func findRatio(rs []MetricRatio, metric string) *MetricRatio {
	for i := range rs {
		if metric != "" && rs[i].Metric == metric {
			return &rs[i]
		}
	}
	return nil
}

// writeTable writes the dispenser's numbers, beside each echo's when there are baselines.
func (r *Report) writeTable(w io.Writer) {
	t := &phaseTable{w: w, phases: []*PhaseReport{&r.Dispenser}}
	header, ratioHeader := "\tdispenser", ""
	for _, b := range []struct {
		report      *BaselineReport
		name, ratio string
	}{{r.Baseline, "echo", "dispenser/echo"}, {r.BaselineProcess, "echo-process", "dispenser/echo-process"}} {
		if b.report != nil && b.report.Echo != nil {
			t.phases = append(t.phases, b.report.Echo)
			t.ratios = append(t.ratios, b.report.Ratios)
			header += "\t" + b.name
			ratioHeader += "\t" + b.ratio
		}
	}
	fmt.Fprintln(w, header+ratioHeader+"\t")
	t.row("elapsed", func(p *PhaseReport) string { return fmt.Sprintf("%.2fs", p.ElapsedS) }, "")
	t.row("requests sent", func(p *PhaseReport) string { return group(p.Sent) }, "")
	t.row("good replies", func(p *PhaseReport) string { return group(p.OK) }, "")
	t.row("IDs", func(p *PhaseReport) string { return group(p.IDs) }, "")
	t.row("requests/s", func(p *PhaseReport) string { return group(int64(p.RequestsPerS)) }, "requests/s")
	t.row("IDs/s", func(p *PhaseReport) string { return group(int64(p.IDsPerS)) }, "IDs/s")
	lat := []struct {
		name, metric string
		v            func(l Latency) float64
	}{
		{"latency p50", "p50 µs", func(l Latency) float64 { return l.P50 }},
		{"latency p90", "p90 µs", func(l Latency) float64 { return l.P90 }},
		{"latency p99", "p99 µs", func(l Latency) float64 { return l.P99 }},
		{"latency p99.9", "p99.9 µs", func(l Latency) float64 { return l.P999 }},
		{"latency max", "max µs", func(l Latency) float64 { return l.Max }},
	}
	for _, l := range lat {
		t.row(l.name, func(p *PhaseReport) string {
			if p.Latency.Count == 0 {
				return "-"
			}
			return latencyString(l.v(p.Latency))
		}, l.metric)
	}
	if r.Dispenser.SendLag != nil {
		t.row("sender lag p99", func(p *PhaseReport) string { return latencyString(p.SendLag.P99) }, "")
		t.row("sender lag max", func(p *PhaseReport) string { return latencyString(p.SendLag.Max) }, "")
	}
	r.writeCPURows(t)
	t.row("errors", func(p *PhaseReport) string { return errorsString(p.Errors) }, "")
	if r.Dispenser.LateReplies > 0 || r.Dispenser.SlowConsumer > 0 {
		t.row("late replies", func(p *PhaseReport) string { return group(p.LateReplies) }, "")
		t.row("slow-consumer events", func(p *PhaseReport) string { return group(p.SlowConsumer) }, "")
	}
	if r.Dispenser.OrderViolations > 0 {
		t.row("IDS OUT OF ORDER IN A REPLY", func(p *PhaseReport) string { return group(p.OrderViolations) }, "")
	}
}

// writeCPURows writes CPU µs per request for each watched process, then their total.
func (r *Report) writeCPURows(t *phaseTable) {
	labels := map[string]bool{}
	for _, p := range t.phases {
		for label := range p.CPU {
			labels[label] = true
		}
	}
	if len(labels) == 0 {
		return
	}
	cpu := func(v float64, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.1fµs", v)
	}
	for _, label := range slices.Sorted(maps.Keys(labels)) {
		t.row("CPU/req "+label, func(p *PhaseReport) string { v, ok := p.CPU[label]; return cpu(v, ok) }, "")
	}
	t.row("CPU/req total", func(p *PhaseReport) string { return cpu(cpuTotal(p.CPU), len(p.CPU) > 0) }, "CPU µs/request")
}

// writeNotes writes what does not fit the table: error samples, the check's findings and
// how the baseline was set up (or why it did not run).
func (r *Report) writeNotes(w io.Writer) {
	if len(r.Dispenser.ErrorSamples) > 0 {
		fmt.Fprintln(w, "\nerror samples (warm-up included):")
		for _, key := range slices.Sorted(maps.Keys(r.Dispenser.ErrorSamples)) {
			for _, s := range r.Dispenser.ErrorSamples[key] {
				fmt.Fprintf(w, "  %s: %s\n", key, s)
			}
		}
	}
	if c := r.Check; c != nil {
		fmt.Fprintf(w, "\ncheck: %s IDs, %s duplicates", group(c.IDs), group(c.Duplicates))
		if c.Regressions != nil {
			fmt.Fprintf(w, ", %s replies below the client's previous for the tag (allowed: trend-increasing)", group(*c.Regressions))
		}
		if c.SpilledRuns > 0 {
			fmt.Fprintf(w, ", %d runs spilled", c.SpilledRuns)
		}
		fmt.Fprintln(w)
		if c.Duplicates > 0 {
			fmt.Fprintf(w, "DUPLICATE IDS, e.g. %s\n", strings.Join(c.DuplicateSamples, " "))
		}
	}
	for _, b := range []*BaselineReport{r.Baseline, r.BaselineProcess} {
		switch {
		case b == nil:
		case b.Error != "":
			fmt.Fprintf(w, "\nbaseline echo (%s): not run: %s\n", b.Where, b.Error)
		default:
			fmt.Fprintf(w, "\nbaseline echo (%s): %d responders (%s), canned replies of %v bytes\n", b.Where, b.Responders, b.RespondersSource, b.PayloadBytes)
			if len(b.RoundRatios) > 1 {
				var rs []string
				for _, x := range b.RoundRatios {
					rs = append(rs, fmt.Sprintf("%.2f", x))
				}
				fmt.Fprintf(w, "  requests/s ratio per round: %s (median %.2f)\n", strings.Join(rs, " "), b.MedianRoundRatio)
			}
		}
	}
}

// baselineFailed reports a baseline that was asked for and could not run.
func (r *Report) baselineFailed() bool {
	return (r.Baseline != nil && r.Baseline.Error != "") || (r.BaselineProcess != nil && r.BaselineProcess.Error != "")
}

func ratioString(r *MetricRatio) string {
	if r == nil {
		return ""
	}
	if r.Ratio == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *r.Ratio)
}

func latencyString(usec float64) string {
	switch {
	case usec < 1000:
		return fmt.Sprintf("%.1fµs", usec)
	case usec < 1e6:
		return fmt.Sprintf("%.2fms", usec/1e3)
	default:
		return fmt.Sprintf("%.3fs", usec/1e6)
	}
}

func errorsString(errs map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		if errs[k] > 0 {
			parts = append(parts, k+": "+group(errs[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// group writes n with thousands separators.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
