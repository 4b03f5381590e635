package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/metrics"
)

// The monitoring files under test, relative to this package's directory.
const (
	prometheusConf   = "prometheus.yml"
	dashboardFile    = "grafana/dashboards/leafbus.json"
	datasourceConf   = "grafana/provisioning/datasources/prometheus.yml"
	dashboardsConf   = "grafana/provisioning/dashboards/leafbus.yml"
	dashboardDSInput = "${datasource}"
)

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestPrometheusScrapesEveryDispenser(t *testing.T) {
	var conf struct {
		Global        map[string]string `yaml:"global"`
		RuleFiles     []string          `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			Scheme        string `yaml:"scheme"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, prometheusConf, &conf)
	if len(conf.ScrapeConfigs) != 1 {
		t.Fatalf("%s: %d scrape configs, want 1 (job leafbus)", prometheusConf, len(conf.ScrapeConfigs))
	}
	if len(conf.RuleFiles) != 1 || conf.RuleFiles[0] != alertRules {
		t.Errorf("%s: rule_files %q, want [%s]", prometheusConf, conf.RuleFiles, alertRules)
	}
	job := conf.ScrapeConfigs[0]
	if job.JobName != "leafbus" || job.MetricsPath != "/metrics" {
		t.Errorf("job %q path %q, want leafbus /metrics (the dashboard selects job=\"leafbus\")", job.JobName, job.MetricsPath)
	}
	var targets []string
	for _, sc := range job.StaticConfigs {
		targets = append(targets, sc.Targets...)
	}
	if strings.Join(targets, ",") != "dispenser-1:8080,dispenser-2:8080" {
		t.Errorf("targets %v, want the two dispensers of docker-compose.yml on their HTTP port", targets)
	}
}

func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name      string `yaml:"name"`
			UID       string `yaml:"uid"`
			Type      string `yaml:"type"`
			Access    string `yaml:"access"`
			URL       string `yaml:"url"`
			IsDefault bool   `yaml:"isDefault"`
			Editable  bool   `yaml:"editable"`
		} `yaml:"datasources"`
	}
	readYAML(t, datasourceConf, &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !ds.Datasources[0].IsDefault {
		t.Errorf("%s: %+v, want one default prometheus data source", datasourceConf, ds.Datasources)
	}
	var dash struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name            string            `yaml:"name"`
			Folder          string            `yaml:"folder"`
			Type            string            `yaml:"type"`
			DisableDeletion bool              `yaml:"disableDeletion"`
			AllowUIUpdates  bool              `yaml:"allowUiUpdates"`
			Options         map[string]string `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, dashboardsConf, &dash)
	if len(dash.Providers) != 1 || dash.Providers[0].Options["path"] == "" {
		t.Errorf("%s: %+v, want one file provider with a path", dashboardsConf, dash.Providers)
	}
}

// dashboard is the part of Grafana's dashboard JSON the test reads.
type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// metricName finds the metric names in a PromQL expression.
var metricName = regexp.MustCompile(`\b(leafbus|go|process)_[a-z0-9_]+\b`)

// TestDashboardQueriesExist checks that every metric the dashboard queries is one the
// dispenser really exports: the names are taken from a registry built by package
// metrics with every source set, plus the HTTP face's own gauge.
func TestDashboardQueriesExist(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID != "leafbus" {
		t.Errorf("dashboard uid %q, want leafbus", d.UID)
	}
	exported := exportedNames(t)
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != dashboardDSInput {
			t.Errorf("panel %q: data source %q, want %s (the dashboard's variable)", p.Title, p.Datasource.UID, dashboardDSInput)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			if !exported[name] {
				t.Errorf("the dashboard queries %s, which the dispenser does not export (in %q)", name, e)
			}
		}
	}
}

// exportedNames gathers every series name the dispenser's registry exports, with the
// _bucket, _sum and _count series of histograms and summaries.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	m, err := metrics.New(metrics.Config{MaxTags: 1, Sources: metrics.Sources{
		SegmentTags: func() []metrics.SegmentTag {
			return []metrics.SegmentTag{{Tag: "a", LastLoad: time.Now()}, {Tag: "b", LastLoad: time.Now()}}
		},
		Snowflake: func() (metrics.Snowflake, bool) { return metrics.Snowflake{Lease: metrics.LeaseHeld}, true },
		Pools:     func() []metrics.Pool { return []metrics.Pool{{Kind: "segment", Tag: "a", Where: "replies"}} },
		NATS:      func() metrics.NATSServer { return metrics.NATSServer{} },
		Recovery:  func() metrics.Recovery { return metrics.Recovery{} },
		Monotonic: func() metrics.Monotonic {
			return metrics.Monotonic{Tags: []metrics.MonotonicTag{{Tag: "m", Role: metrics.RoleLeader}}}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe(metrics.NATS, "segment", 200, 0.001, 1)
	if _, err := httpapi.New("127.0.0.1:0", withMetrics(t, m)); err != nil {
		t.Fatal(err)
	}
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		n := f.GetName()
		names[n] = true
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[n+"_sum"], names[n+"_count"] = true, true
		}
	}
	return names
}

func withMetrics(tb testing.TB, m *metrics.Metrics) httpapi.Config {
	cfg := httpapi.DefaultConfig()
	c, err := core.New(core.DefaultConfig())
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Core, cfg.Metrics = c, m
	return cfg
}
