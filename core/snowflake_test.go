package core

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/snowflake"
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

func sfReq(n int) Request { return Request{Kind: wire.Snowflake, Tag: "orders", Count: n} }

// A snowflake request refused by a generator that resumes soon (its lease being
// renewed, its worker ID replaced) is held and answered with IDs once it issues again;
// one that does not resume within WaitMax gets the 503. A hedging client has meanwhile
// taken another dispenser's answer.
func TestSnowflakeRequestWaitsForResume(t *testing.T) {
	src := &pausedSnowflakes{}
	const waitMax = 500 * time.Millisecond
	c := newCore(t, func(cfg *Config) { cfg.Snowflakes, cfg.WaitMax = src, waitMax })

	begin := time.Now()
	if _, err := get(t, c, sfReq(1)); codeOrZero(err) != 503 {
		t.Fatalf("request to a generator that stays suspended: %v; want a 503", err)
	}
	if d := time.Since(begin); d < waitMax {
		t.Fatalf("503 after %s, want it held for WaitMax %s", d, waitMax)
	}

	go func() {
		time.Sleep(100 * time.Millisecond)
		src.resumed.Store(true)
	}()
	if ids, err := get(t, c, sfReq(3)); err != nil || fmt.Sprint(ids) != "[1 2 3]" {
		t.Fatalf("request held until the generator resumed: %v, %v; want the IDs", ids, err)
	}
	if st := c.Stats(wire.Snowflake); st.Waited != 2 || st.WaitErrors != 1 || st.IDsIssued != 3 {
		t.Fatalf("stats %+v; want waited 2, wait errors 1, 3 IDs issued", st)
	}
	if mayResume(snowflake.ErrTimestampOverflow) || mayResume(snowflake.ErrClockBackwards) || !mayResume(errors.Join(snowflake.ErrCeiling)) {
		t.Fatalf("mayResume: an overflow and a clock step are answered at once, a ceiling is waited for")
	}
}

// TestStopAnswersHeldSnowflakes: Stop answers a held snowflake request at once (with the
// refusal) instead of holding the stop for WaitMax, and refuses new waits.
func TestStopAnswersHeldSnowflakes(t *testing.T) {
	c := newCore(t, func(cfg *Config) { cfg.Snowflakes, cfg.WaitMax = &pausedSnowflakes{}, time.Hour })
	got := make(chan Answer, 1)
	if err := c.Wait(sfReq(1), func(a Answer) { got <- a }); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case a := <-got:
		if codeOrZero(a.Err) != 503 {
			t.Fatalf("held request at Stop = %+v, want the 503 refusal", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held snowflake request not answered within 10s of Stop")
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}
	if err := c.Wait(sfReq(1), func(Answer) { t.Error("done called after a refused Wait") }); codeOrZero(err) != 503 {
		t.Fatalf("Wait after Stop = %v, want a 503", err)
	}
}
