package main

import (
	"testing"
	"time"
)

func TestWaitUntil(t *testing.T) {
	tests := []struct {
		name  string
		due   time.Duration // after the call
		close bool          // done is closed before the call
		want  bool
	}{
		{"Past", -time.Millisecond, false, true},
		{"ShortPreciseOnly", 300 * time.Microsecond, false, true},
		{"LongTimerThenPrecise", 5 * time.Millisecond, false, true},
		{"InterruptedDuringTimer", time.Hour, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			done := make(chan struct{})
			if tt.close {
				close(done)
			}
			epoch := time.Now()
			result := make(chan bool, 1)
			go func() { result <- waitUntil(epoch, tt.due, timer, done) }()
			select {
			case got := <-result:
				if got != tt.want {
					t.Fatalf("waitUntil(%v) = %v, want %v", tt.due, got, tt.want)
				}
				if got && time.Since(epoch) < tt.due {
					t.Fatalf("waitUntil(%v) returned after %v: early sends would hide latency", tt.due, time.Since(epoch))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("waitUntil(%v) did not return within 5s", tt.due)
			}
		})
	}
}

// BenchmarkWaitUntil200us reports how late the open-loop sender wakes for a slot due in
// 200 µs, next to a plain Go timer: the difference is latency the bench would otherwise
// charge to the server.
func BenchmarkWaitUntil200us(b *testing.B) {
	for _, bc := range []struct {
		name string
		wait func(epoch time.Time, due time.Duration, timer *time.Timer)
	}{
		{"waitUntil", func(epoch time.Time, due time.Duration, timer *time.Timer) { waitUntil(epoch, due, timer, nil) }},
		{"GoTimer", func(epoch time.Time, due time.Duration, timer *time.Timer) {
			timer.Reset(due - time.Since(epoch))
			<-timer.C
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			timer := time.NewTimer(time.Hour)
			timer.Stop()
			var late time.Duration
			for b.Loop() {
				epoch := time.Now()
				bc.wait(epoch, 200*time.Microsecond, timer)
				late += time.Since(epoch) - 200*time.Microsecond
			}
			b.ReportMetric(float64(late.Microseconds())/float64(b.N), "late-µs/op")
		})
	}
}
