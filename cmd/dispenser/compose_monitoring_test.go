package main

import (
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// mountOf returns the container path where service s mounts the repository path src
// (as written in the compose file, e.g. ./deploy/prometheus.yml), or "".
func mountOf(s composeService, src string) string {
	for _, v := range s.Volumes {
		from, to, _ := strings.Cut(v, ":")
		to, _, _ = strings.Cut(to, ":")
		if filepath.Clean(from) == filepath.Clean(src) {
			return to
		}
	}
	return ""
}

// readDeployYAML parses a file under deploy/ into v.
func readDeployYAML(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("parse deploy/%s: %v", name, err)
	}
}

// TestComposeMonitoring: Prometheus reads deploy/prometheus.yml where its --config.file
// says, and every target it scrapes is a dispenser serving HTTP on that port; Grafana
// gets the provisioning files where it reads them and the dashboards where the
// provider looks, and its data source is the Prometheus service.
func TestComposeMonitoring(t *testing.T) {
	f := loadCompose(t)
	proms, grafanas := f.servicesWithImage("prom/prometheus"), f.servicesWithImage("grafana/grafana")
	if len(proms) != 1 || len(grafanas) != 1 {
		t.Fatalf("Prometheus services %v, Grafana services %v: want one each", proms, grafanas)
	}
	prom, grafana := f.Services[proms[0]], f.Services[grafanas[0]]

	conf := mountOf(prom, "./deploy/prometheus.yml")
	if conf == "" || !slices.Contains(prom.Command, "--config.file="+conf) {
		t.Errorf("service %s: mounts deploy/prometheus.yml at %q, command %q: want --config.file naming it", proms[0], conf, prom.Command)
	}
	var scrape struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readDeployYAML(t, "prometheus.yml", &scrape)
	// A rule file is found relative to the configuration: it must be mounted there.
	for _, rf := range scrape.RuleFiles {
		if got, want := mountOf(prom, "./deploy/"+rf), path.Join(path.Dir(conf), rf); got != want {
			t.Errorf("service %s: deploy/prometheus.yml loads rule file %s, which it finds at %s; deploy/%s is mounted at %q", proms[0], rf, want, rf, got)
		}
	}
	scraped := map[string]bool{}
	for _, sc := range scrape.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, _ := net.SplitHostPort(target)
				scraped[host] = true
				s, ok := f.Services[host]
				if !ok || s.program() != "dispenser" {
					t.Errorf("deploy/prometheus.yml target %s: %q is not a dispenser service", target, host)
					continue
				}
				env := dockerfileEnv(t)
				for k, v := range s.Environment {
					env[k] = v
				}
				cfg := defaultConfig()
				if err := cfg.parse(s.Command, func(k string) string { return env[k] }, io.Discard); err != nil {
					t.Errorf("service %s: %v", host, err)
					continue
				}
				if _, httpPort, _ := net.SplitHostPort(cfg.HTTP); httpPort != port {
					t.Errorf("deploy/prometheus.yml target %s: %s serves HTTP on --http %q", target, host, cfg.HTTP)
				}
			}
		}
	}
	for _, name := range f.servicesRunning("dispenser") {
		if !scraped[name] {
			t.Errorf("dispenser %s is not scraped by deploy/prometheus.yml", name)
		}
	}

	if got := mountOf(grafana, "./deploy/grafana/provisioning"); got != "/etc/grafana/provisioning" {
		t.Errorf("service %s: deploy/grafana/provisioning mounted at %q, want /etc/grafana/provisioning", grafanas[0], got)
	}
	var providers struct {
		Providers []struct {
			Options map[string]string `yaml:"options"`
		} `yaml:"providers"`
	}
	readDeployYAML(t, "grafana/provisioning/dashboards/leafbus.yml", &providers)
	if got := mountOf(grafana, "./deploy/grafana/dashboards"); len(providers.Providers) != 1 || got != providers.Providers[0].Options["path"] {
		t.Errorf("service %s: deploy/grafana/dashboards mounted at %q, want the provider's path %v", grafanas[0], got, providers.Providers)
	}
	var sources struct {
		Datasources []struct {
			URL string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readDeployYAML(t, "grafana/provisioning/datasources/prometheus.yml", &sources)
	for _, ds := range sources.Datasources {
		u, err := url.Parse(ds.URL)
		if err != nil || u.Hostname() != proms[0] || u.Port() != "9090" {
			t.Errorf("Grafana data source %q: want the %s service on Prometheus' port 9090", ds.URL, proms[0])
		}
	}
}
