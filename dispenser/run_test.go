package dispenser

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oklog/run"
)

// TestAddLoop: a loop that ends by itself stops the group with an error naming it (a
// dispenser must never exit 0 because one of its parts quietly returned), a loop that
// fails passes its error on, and an interrupted loop is a clean stop.
func TestAddLoop(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		loop    func(context.Context) error
		want    string
		wantErr error
	}{
		{"ReturnsNil", func(context.Context) error { return nil }, "pools: stopped by itself", nil},
		{"Fails", func(context.Context) error { return boom }, "pools: boom", boom},
		{"ReadyThenNothingToDo", afterReady(closedChan(), func(context.Context) error { return nil }), "", nil},
		{"ReadyThenFails", afterReady(closedChan(), func(context.Context) error { return boom }), "pools: boom", boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g run.Group
			addLoop(&g, "pools", tt.loop)
			// The stand-in for the signal handler: ends the group after a moment.
			stop := make(chan struct{})
			g.Add(func() error {
				select {
				case <-stop:
					return nil
				case <-time.After(200 * time.Millisecond):
					return context.Canceled
				}
			}, func(error) { close(stop) })
			done := make(chan error, 1)
			go func() { done <- g.Run() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("group did not stop")
			}
			if tt.want == "" {
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v, want the interrupt's (the loop kept running until stopped)", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, does not wrap %v", err, tt.wantErr)
			}
		})
	}
}

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
