package deploy

import (
	"os/exec"
	"strings"
	"testing"
)

// The alert rules and their promtool unit tests, relative to this package's directory.
const (
	alertRules     = "prometheus/alerts.yml"
	alertRuleTests = "prometheus/alerts_test.yml"
)

// TestAlertRules: deploy/prometheus/alerts.yml is a strict rules file (no unknown
// field), every alert says how bad it is and what to do, every metric it queries is one
// the dispenser exports (package metrics' registry, as the dashboard's are checked), and
// Prometheus' own promtool accepts it (check rules) and fires each alert on the series
// that mean it and not on a healthy fleet (test rules, alerts_test.yml).
func TestAlertRules(t *testing.T) {
	var rules struct {
		Groups []struct {
			Name     string `yaml:"name"`
			Interval string `yaml:"interval"`
			Rules    []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, alertRules, &rules)
	exported := exportedNames(t)
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert (recording rules belong elsewhere): %q", g.Name, r.Expr)
				continue
			}
			alerts[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "page" && sev != "ticket" {
				t.Errorf("alert %s: severity %q, want page or ticket", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a summary and a description", r.Alert)
			}
			if !strings.Contains(r.Expr, `job="leafbus"`) {
				t.Errorf("alert %s: %q does not select job=\"leafbus\", the scrape job of %s", r.Alert, r.Expr, prometheusConf)
			}
			for _, name := range metricName.FindAllString(r.Expr, -1) {
				if !exported[name] {
					t.Errorf("alert %s queries %s, which the dispenser does not export (in %q)", r.Alert, name, r.Expr)
				}
			}
		}
	}
	// What the issue asks to be alerted on (duplicates cannot happen by design).
	for _, want := range []string{"LeafbusNoDispenserUp", "LeafbusUnavailableRate", "LeafbusClockBehind", "LeafbusWorkerLeaseLost", "LeafbusSegmentStoreUnavailable"} {
		if !alerts[want] {
			t.Errorf("%s has no alert %s", alertRules, want)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found (Debian package prometheus): run make deps")
	}
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertRuleTests}, {"check", "config", prometheusConf}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
