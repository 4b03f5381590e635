package testutil

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape GETs url (a /metrics) from a real HTTP server and parses it with Prometheus'
// text parser, as Prometheus would: the families by name. A status other than 200 or a
// body not in the text format fails the test.
func Scrape(tb testing.TB, url string) map[string]*dto.MetricFamily {
	tb.Helper()
	families, status, body := TryScrape(tb, url)
	if status != http.StatusOK {
		tb.Fatalf("GET %s: status %d: %s", url, status, body)
	}
	return families
}

// TryScrape is Scrape for a server that may turn the scrape away (a busy HTTP face): an
// answer other than 200 is returned with its status and body, not failed.
func TryScrape(tb testing.TB, url string) (families map[string]*dto.MetricFamily, status int, body string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, resp.StatusCode, string(b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		tb.Fatalf("GET %s: Content-Type %q, want the text format", url, ct)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err = parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		tb.Fatalf("parse %s: %v", url, err)
	}
	return families, resp.StatusCode, ""
}
