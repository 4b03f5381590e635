package backoff_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leafbus/leafbus/internal/backoff"
)

// A retry loop: wait as the policy says after each failure, start again from Min after
// a success, and stop when the context ends.
func Example() {
	policy := backoff.Policy{Min: time.Millisecond, Max: 8 * time.Millisecond, Jitter: 0.5}
	bo := backoff.New(policy)
	attempts := 0
	try := func() error {
		attempts++
		if attempts < 4 {
			return errors.New("store unreachable")
		}
		return nil
	}
	ctx := context.Background()
	for {
		err := try()
		if err == nil {
			bo.Reset()
			break
		}
		if !bo.Wait(ctx) {
			return
		}
	}
	fmt.Println("succeeded after", attempts, "attempts")
	for attempt := 1; attempt <= 5; attempt++ {
		fmt.Print(policy.Ceiling(attempt), " ")
	}
	fmt.Println()
	// Output:
	// succeeded after 4 attempts
	// 1ms 2ms 4ms 8ms 8ms
}
