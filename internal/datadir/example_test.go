//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package datadir_test

import (
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/leafbus/leafbus/internal/datadir"
)

// A dispenser takes its data dir first and gives it back last; a second one on the same
// dir is refused and told who holds it.
func Example() {
	dir, err := os.MkdirTemp("", "leafbus-data-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	lock, err := datadir.Acquire(dir, "host-1")
	if err != nil {
		log.Fatal(err) // exit 1: the message names the holder, or why the dir is unusable
	}
	defer lock.Release() // last, after everything that uses the dir has stopped

	_, err = datadir.Acquire(dir, "host-2")
	var inUse *datadir.InUseError
	if errors.As(err, &inUse) {
		fmt.Println("refused:", errors.Is(err, datadir.ErrInUse))
		fmt.Println("holder:", inUse.Holder.NodeID, inUse.Holder.PID == os.Getpid())
	}
	// Output:
	// refused: true
	// holder: host-1 true
}
