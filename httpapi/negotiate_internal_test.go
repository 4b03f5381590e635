package httpapi

import "testing"

// Negotiation runs on every ID request: it must cost no allocation for the headers
// clients send.
func TestWantsJSONAllocatesNothing(t *testing.T) {
	for _, accept := range [][]string{
		nil,
		{"application/json, application/*+json"},
		{"text/plain, application/json, application/*+json, */*"},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"},
	} {
		if n := testing.AllocsPerRun(100, func() { wantsJSON("", accept) }); n != 0 {
			t.Errorf("wantsJSON(%q): %v allocations, want 0", accept, n)
		}
	}
}
