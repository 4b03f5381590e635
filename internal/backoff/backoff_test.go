package backoff_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/testutil"
)

const ms = time.Millisecond

func TestPolicyCeiling(t *testing.T) {
	tests := []struct {
		name    string
		policy  backoff.Policy
		attempt int
		want    time.Duration
	}{
		{"FirstIsMin", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, 1, 20 * ms},
		{"ZeroCountsAsFirst", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, 0, 20 * ms},
		{"NegativeCountsAsFirst", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, -3, 20 * ms},
		{"Doubles", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, 4, 160 * ms},
		{"CappedAtMax", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, 8, 2 * time.Second},
		{"StaysAtMax", backoff.Policy{Min: 20 * ms, Max: 2 * time.Second}, 1 << 30, 2 * time.Second},
		{"MaxBelowMin", backoff.Policy{Min: 50 * ms, Max: 10 * ms}, 1, 10 * ms},
		{"NoOverflowNearMaxDuration", backoff.Policy{Min: time.Second, Max: time.Duration(1<<63 - 1)}, 200, time.Duration(1<<63 - 1)},
		{"ZeroPolicyWaitsNothing", backoff.Policy{}, 5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.Ceiling(tt.attempt); got != tt.want {
				t.Errorf("%+v.Ceiling(%d) = %v, want %v", tt.policy, tt.attempt, got, tt.want)
			}
		})
	}
}

// TestBackoffSequence: with a fixed random source every wait is known, lies in
// [ceiling*(1-Jitter), ceiling], and Reset starts again from Min.
func TestBackoffSequence(t *testing.T) {
	p := backoff.Policy{Min: 20 * ms, Max: 2 * time.Second, Jitter: 0.5}
	seq := func(b *backoff.Backoff, n int) []time.Duration {
		var out []time.Duration
		for range n {
			out = append(out, b.Next())
		}
		return out
	}
	a := seq(backoff.NewWithSource(p, rand.NewPCG(1, 2)), 12)
	b := seq(backoff.NewWithSource(p, rand.NewPCG(1, 2)), 12)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("wait #%d: %v and %v from the same seed, want equal", i+1, a[i], b[i])
		}
		ceil := p.Ceiling(i + 1)
		if a[i] < ceil/2 || a[i] > ceil {
			t.Errorf("wait #%d = %v, want between %v and %v", i+1, a[i], ceil/2, ceil)
		}
	}
	if a[len(a)-1] < time.Second {
		t.Errorf("wait #%d = %v, want the cap's range [1s, 2s]", len(a), a[len(a)-1])
	}

	bo := backoff.NewWithSource(p, rand.NewPCG(3, 4))
	seq(bo, 5)
	if got := bo.Failures(); got != 5 {
		t.Errorf("Failures after 5 Next = %d, want 5", got)
	}
	bo.Reset()
	if got := bo.Failures(); got != 0 {
		t.Errorf("Failures after Reset = %d, want 0", got)
	}
	if got := bo.Next(); got < 10*ms || got > 20*ms {
		t.Errorf("Next after Reset = %v, want Min's range [10ms, 20ms]", got)
	}
}

// TestBackoffJitter: Jitter sets how much of each wait is random.
func TestBackoffJitter(t *testing.T) {
	tests := []struct {
		name      string
		jitter    float64
		low, high time.Duration // bounds of the first wait with Min 300ms
	}{
		{"None", 0, 300 * ms, 300 * ms},
		{"Equal", 0.5, 150 * ms, 300 * ms},
		{"Third", 1.0 / 3, 200 * ms, 300 * ms},
		{"Full", 1, 0, 300 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := backoff.Policy{Min: 300 * ms, Max: time.Second, Jitter: tt.jitter}
			src := rand.NewPCG(5, 6)
			lo, hi := time.Duration(1<<63-1), time.Duration(0)
			for range 2000 {
				d := backoff.NewWithSource(p, src).Next()
				lo, hi = min(lo, d), max(hi, d)
			}
			if lo < tt.low || hi > tt.high {
				t.Fatalf("2000 first waits ranged over [%v, %v], want within [%v, %v]", lo, hi, tt.low, tt.high)
			}
			// The draws cover the range: each end is approached within 5% of it.
			if span := tt.high - tt.low; lo > tt.low+span/20 || hi < tt.high-span/20 {
				t.Errorf("2000 first waits ranged over [%v, %v], want close to [%v, %v]", lo, hi, tt.low, tt.high)
			}
		})
	}
}

// TestPolicyDelay: the process-wide source keeps Delay inside the same bounds.
func TestPolicyDelay(t *testing.T) {
	p := backoff.Policy{Min: 375 * ms, Max: 7500 * ms, Jitter: 1.0 / 3}
	for attempt := 1; attempt <= 10; attempt++ {
		ceil := p.Ceiling(attempt)
		for range 100 {
			if d := p.Delay(attempt); d < ceil*2/3 || d > ceil {
				t.Fatalf("Delay(%d) = %v, want between %v and %v", attempt, d, ceil*2/3, ceil)
			}
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name    string
		policy  backoff.Policy
		wantErr string // "" for OK
	}{
		{"OK", backoff.Policy{Min: ms, Max: time.Second, Jitter: 0.5}, ""},
		{"OKMaxBelowMin", backoff.Policy{Min: time.Second, Max: ms}, ""},
		{"ErrMin", backoff.Policy{Min: 0, Max: time.Second}, "Min 0s must be > 0"},
		{"ErrMax", backoff.Policy{Min: ms, Max: -time.Second}, "Max -1s must be > 0"},
		{"ErrJitterNegative", backoff.Policy{Min: ms, Max: time.Second, Jitter: -0.1}, "Jitter -0.1 must be between 0 and 1"},
		{"ErrJitterOverOne", backoff.Policy{Min: ms, Max: time.Second, Jitter: 1.5}, "Jitter 1.5 must be between 0 and 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testutil.CheckErr(t, fmt.Sprintf("%+v.Validate()", tt.policy), tt.policy.Validate(), nil, tt.wantErr)
		})
	}
}

func TestSleep(t *testing.T) {
	if !backoff.Sleep(context.Background(), ms) {
		t.Errorf("Sleep(live ctx, 1ms) = false, want true")
	}
	if !backoff.Sleep(context.Background(), 0) {
		t.Errorf("Sleep(live ctx, 0) = false, want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if backoff.Sleep(ctx, 0) {
		t.Errorf("Sleep(ended ctx, 0) = true, want false")
	}
	began := time.Now()
	if backoff.Sleep(ctx, time.Hour) {
		t.Errorf("Sleep(ended ctx, 1h) = true, want false")
	}
	// A context that ends during the wait cuts it short.
	ctx, cancel = context.WithTimeout(context.Background(), 20*ms)
	defer cancel()
	if backoff.NewWithSource(backoff.Policy{Min: time.Hour, Max: time.Hour}, rand.NewPCG(1, 1)).Wait(ctx) {
		t.Errorf("Wait(ctx ending in 20ms) with a 1h back-off = true, want false")
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("Sleep and Wait on ended contexts took %v, want them to return at once", d)
	}
}
