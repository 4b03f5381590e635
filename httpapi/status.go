package httpapi

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
)

// Status is what the status page shows, besides the server's own figures.
type Status struct {
	NodeID       string
	Prefix       string // the subject prefix
	NATS         string // the NATS URL the dispenser serves on
	SegmentStore string // kv | mysql

	// Sources are the same snapshots /metrics reads: segment tags, snowflake worker, pools.
	Sources metrics.Sources
	// Rows are the segment store's rows (Leaf's leaf_alloc with the MySQL store, as
	// Leaf's /db page shows them); nil leaves the section out.
	Rows TagRows
	// TagRange describes a tag's range when it is not the default ("opaque, 53 bits,
	// key ...", "53 bits"; PROTOCOL.md "Opaque tags and widths"), "" for the default;
	// shown beside the tag's buffers and its row. nil: not shown.
	TagRange func(tag string) string
	// Opaque reports whether a tag is opaque: its counters (buffers, max_id, metrics
	// series) are shown on the monitor listener only (faces.go). nil: none is.
	Opaque func(tag string) bool
	// Cluster returns every dispenser the $SRV discovery finds; nil leaves it out. Page
	// loads share one call at a time, and its result for clusterFresh: however many
	// load the page, the dispensers are asked about once a second.
	Cluster func(ctx context.Context) ([]Peer, error)

	Refresh      time.Duration // the page reloads itself this often
	MaxTags      int           // tags and rows shown; the busiest first
	MaxPeers     int           // dispensers listed (this node and the first by node ID)
	FetchTimeout time.Duration // bounds reading Rows and Cluster for one page
}

// TagRows reads the segment store's rows (segment.Store has it).
type TagRows interface {
	Tags(ctx context.Context) ([]core.TagRow, error)
}

// Peer is one dispenser found by discovery.
type Peer struct {
	NodeID   string
	Version  string
	WorkerID int64     // -1 when it did not say
	Clock    time.Time // its clock when asked; zero when it did not answer
	Error    string    // why it could not be asked, if so
}

//go:embed status.html
var statusHTML string

// statusPage renders the page; the template is parsed once.
type statusPage struct {
	tmpl *template.Template
	bufs sync.Pool // *bytes.Buffer
}

func newStatusPage() (*statusPage, error) {
	t, err := template.New("status").Funcs(template.FuncMap{
		"ago":      func(d time.Duration) string { return d.Round(time.Second).String() },
		"dur":      formatDuration,
		"when":     func(t time.Time) string { return formatTime(t) },
		"ms":       formatMs,
		"since":    since,
		"prepared": func(p metrics.Pool) int64 { return int64(p.Ready) * int64(p.Size) },
	}).Parse(statusHTML)
	if err != nil {
		return nil, fmt.Errorf("httpapi: status page template: %w", err)
	}
	return &statusPage{tmpl: t}, nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// formatMs shows Unix milliseconds as a time; 0 (none yet) as a dash.
func formatMs(ms int64) string {
	if ms == 0 {
		return "—"
	}
	return formatTime(time.UnixMilli(ms))
}

// since is how long ago t was, at now; a dash for never.
func since(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

func formatDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d < time.Second {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// pageData is everything the template shows.
type pageData struct {
	Refresh  int
	Now      time.Time
	Node     Status
	Version  string
	Uptime   time.Duration
	NotReady []string
	Warning  string // Health.Warning: wrong, but served safely

	Snowflake     *metrics.Snowflake
	SnowflakeAge  time.Duration // since the last clock record
	Totals        []metrics.Total
	Issued        map[string]uint64 // IDs issued per kind, both transports
	Tags          []metrics.SegmentTag
	TagRanges     map[string]string // of Tags, those not the default
	TagCount      int
	MoreTags      int
	Rows          []statusRow
	RowCount      int
	RowsErr       string
	Pools         []metrics.Pool
	Cluster       []peerView
	ClusterCount  int // dispensers found, of which Cluster lists the first
	ClusterErr    string
	ShowRows      bool
	ShowRanges    bool
	ShowCluster   bool
	ShowSnowflake bool
}

// statusRow is a store row with its range.
type statusRow struct {
	core.TagRow
	Range string
}

type peerView struct {
	Peer
	Self  bool
	Skew  time.Duration // its clock minus ours, when it answered
	Known bool          // Clock is set
}

// statusHandler renders the page from fresh snapshots.
func (s *Server) statusHandler(w http.ResponseWriter, r *http.Request) {
	d := s.pageData(r.Context())
	buf, _ := s.status.bufs.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Reset()
	defer s.status.bufs.Put(buf)
	if err := s.status.tmpl.Execute(buf, d); err != nil {
		s.log.Error("http: render the status page", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes()) //nolint:errcheck // the client went away
}

// pageData reads every source; the store rows and the cluster, which cross the
// network, are read at once and within FetchTimeout.
func (s *Server) pageData(ctx context.Context) pageData {
	st := s.cfg.Status
	now := s.now()
	d := pageData{
		Refresh: int(st.Refresh.Round(time.Second) / time.Second), Now: now, Node: st,
		Version: s.cfg.Version, Uptime: now.Sub(s.started), NotReady: s.notReady(),
		Warning:  s.warning(),
		ShowRows: st.Rows != nil, ShowRanges: st.TagRange != nil, ShowCluster: st.Cluster != nil,
	}
	d.Refresh = max(d.Refresh, 1)
	fctx, cancel := context.WithTimeout(ctx, st.FetchTimeout)
	defer cancel()
	var wg sync.WaitGroup
	if st.Rows != nil {
		wg.Go(func() { d.Rows, d.RowCount, d.RowsErr = s.rows(fctx) })
	}
	if st.Cluster != nil {
		wg.Go(func() { d.Cluster, d.ClusterCount, d.ClusterErr = s.cluster(fctx, now) })
	}
	if s.cfg.Metrics != nil {
		d.Totals = s.cfg.Metrics.Totals()
		d.Issued = map[string]uint64{}
		for _, t := range d.Totals {
			if t.Kind != metrics.KindDecode {
				d.Issued[t.Kind] += t.IDs
			}
		}
	}
	if src := st.Sources.Snowflake; src != nil {
		if sf, ok := src(); ok {
			d.Snowflake, d.ShowSnowflake = &sf, true
			if !sf.LastRecord.IsZero() {
				d.SnowflakeAge = now.Sub(sf.LastRecord)
			}
		}
	}
	if src := st.Sources.SegmentTags; src != nil {
		all := slices.DeleteFunc(src(), func(t metrics.SegmentTag) bool { return s.hides(t.Tag) })
		top, rest := metrics.Busiest(all, st.MaxTags)
		slices.SortFunc(top, func(a, b metrics.SegmentTag) int { return cmp.Compare(a.Tag, b.Tag) })
		d.Tags, d.TagCount, d.MoreTags = top, len(all), len(rest)
		if f := st.TagRange; f != nil {
			d.TagRanges = map[string]string{}
			for _, t := range top {
				if r := f(t.Tag); r != "" {
					d.TagRanges[t.Tag] = r
				}
			}
		}
	}
	if src := st.Sources.Pools; src != nil {
		d.Pools = src()
	}
	wg.Wait()
	return d
}

func (s *Server) rows(ctx context.Context) ([]statusRow, int, string) {
	rows, err := s.cfg.Status.Rows.Tags(ctx)
	if err != nil {
		return nil, 0, oneLine(err.Error())
	}
	rows = slices.DeleteFunc(rows, func(t core.TagRow) bool { return s.hides(t.Name) })
	slices.SortFunc(rows, func(a, b core.TagRow) int { return cmp.Compare(a.Name, b.Name) })
	out := make([]statusRow, 0, min(len(rows), s.cfg.Status.MaxTags))
	for _, t := range rows[:min(len(rows), s.cfg.Status.MaxTags)] {
		row := statusRow{TagRow: t}
		if f := s.cfg.Status.TagRange; f != nil {
			row.Range = f(t.Name)
		}
		out = append(out, row)
	}
	return out, len(rows), ""
}

// cluster is the page's list of dispensers: this node and the first MaxPeers-1 others
// by node ID, with how many were found in all.
func (s *Server) cluster(ctx context.Context, now time.Time) ([]peerView, int, string) {
	peers, err := s.clusterCache.get(ctx, s.cfg.Status.Cluster, s.mono())
	peers = slices.Clone(peers) // shared with other page loads
	slices.SortFunc(peers, func(a, b Peer) int { return cmp.Compare(a.NodeID, b.NodeID) })
	views := make([]peerView, 0, min(len(peers), s.cfg.Status.MaxPeers))
	for _, p := range peers {
		self := p.NodeID == s.cfg.Status.NodeID
		if len(views) >= s.cfg.Status.MaxPeers-1 && !self {
			continue // room is kept for this node
		}
		v := peerView{Peer: p, Self: self, Known: !p.Clock.IsZero()}
		if v.Known {
			v.Skew = p.Clock.Sub(now)
		}
		views = append(views, v)
	}
	if err != nil {
		return views, len(peers), oneLine(err.Error())
	}
	return views, len(peers), ""
}

// clusterFresh is how long one discovery serves page loads.
const clusterFresh = time.Second

// clusterCache shares one discovery among page loads: a load within clusterFresh of
// the last discovery takes its result, and loads that come while one runs wait for it
// (or their own context), so page loads never multiply the requests to every
// dispenser.
type clusterCache struct {
	mu      sync.Mutex
	at      time.Duration // when the last result was taken (Server.mono); 0: never
	peers   []Peer
	err     error
	loading chan struct{} // closed when the discovery under way ends; nil when none runs
}

// get returns a fresh enough result, or runs fetch (bounded by ctx) for it.
func (c *clusterCache) get(ctx context.Context, fetch func(context.Context) ([]Peer, error), now time.Duration) ([]Peer, error) {
	c.mu.Lock()
	for c.loading != nil {
		wait := c.loading
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
	}
	if c.at != 0 && now-c.at < clusterFresh {
		defer c.mu.Unlock()
		return c.peers, c.err
	}
	done := make(chan struct{})
	c.loading = done
	c.mu.Unlock()
	peers, err := fetch(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peers, c.err, c.at, c.loading = peers, err, max(now, 1), nil
	close(done)
	return peers, err
}
