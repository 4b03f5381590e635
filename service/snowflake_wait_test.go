package service

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// pausedSnowflakes refuses as a suspended generator does until resumed.
type pausedSnowflakes struct{ resumed atomic.Bool }

func (s *pausedSnowflakes) Fill(dst []int64) error {
	if !s.resumed.Load() {
		return fmt.Errorf("%w: worker ID lease cannot be verified", snowflake.ErrSuspended)
	}
	for i := range dst {
		dst[i] = int64(i + 1)
	}
	return nil
}

// A snowflake request refused by a generator that resumes soon (its lease being
// renewed, its worker ID replaced) is held and answered with IDs once it issues again;
// one that does not resume within WaitMax gets the 503. A hedging client has meanwhile
// taken another dispenser's answer.
func TestSnowflakeRequestWaitsForResume(t *testing.T) {
	ns := testenv.StartNATS(t)
	src := &pausedSnowflakes{}
	cfg := DefaultConfig()
	cfg.Snowflakes, cfg.WaitMax = src, 500*time.Millisecond
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	nc := ns.Connect(t)

	begin := time.Now()
	msg, err := nc.Request("leaf.snowflake.orders", nil, 5*time.Second)
	if err != nil || msg.Header.Get(wire.ServiceErrorCodeHeader) != "503" {
		t.Fatalf("request to a generator that stays suspended: %v, headers %v; want a 503", err, msg.Header)
	}
	if d := time.Since(begin); d < cfg.WaitMax {
		t.Fatalf("503 after %s, want it held for WaitMax %s", d, cfg.WaitMax)
	}

	go func() {
		time.Sleep(100 * time.Millisecond)
		src.resumed.Store(true)
	}()
	msg, err = nc.Request("leaf.snowflake.orders", []byte("3"), 5*time.Second)
	if err != nil || string(msg.Data) != "1\n2\n3" {
		t.Fatalf("request held until the generator resumed: %v, %q; want the IDs", err, msg.Data)
	}
	if svc.sfStats.waited.Load() != 2 || svc.sfStats.waitErrors.Load() != 1 {
		t.Fatalf("waited %d, wait errors %d; want 2 and 1", svc.sfStats.waited.Load(), svc.sfStats.waitErrors.Load())
	}
	if mayResume(snowflake.ErrTimestampOverflow) || mayResume(snowflake.ErrClockBackwards) || !mayResume(errors.Join(snowflake.ErrCeiling)) {
		t.Fatalf("mayResume: an overflow and a clock step are answered at once, a ceiling is waited for")
	}
}
