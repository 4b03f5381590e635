package snowflake_test

import (
	"fmt"
	"time"

	"github.com/leafbus/leafbus/snowflake"
)

// Decoding an ID needs only the layout that made it.
func ExampleLayout_Decode() {
	d, err := snowflake.DefaultLayout().Decode(1992115829461757969)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Time().Format(time.RFC3339Nano), d.Timestamp, d.WorkerID, d.Sequence)

	_, err = snowflake.DefaultLayout().Decode(0)
	fmt.Println(err)
	// Output:
	// 2025-11-22T06:20:00.123Z 1763792400123 3 17
	// snowflake: invalid ID: 0 is not positive
}

// A generator on a fake clock issues predictable IDs, which decode back to its worker and
// the clock's millisecond.
func ExampleGenerator_Next() {
	clock := snowflake.NewFakeClock(time.Date(2025, 11, 22, 6, 20, 0, 123e6, time.UTC))
	g, err := snowflake.New(snowflake.Config{WorkerID: 3, Clock: clock, DenseSequence: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		id, err := g.Next()
		if err != nil {
			fmt.Println(err)
			return
		}
		d, _ := g.Layout().Decode(id)
		fmt.Println(id, d.Time().Format(time.RFC3339Nano), d.WorkerID, d.Sequence)
	}
	// Output:
	// 1992115829461757952 2025-11-22T06:20:00.123Z 3 0
	// 1992115829461757953 2025-11-22T06:20:00.123Z 3 1
}
