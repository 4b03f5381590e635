// Package cpuprofile writes a pprof CPU profile of the whole process to a file, for
// the --cpuprofile flag of the dispenser and of bench.
package cpuprofile

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// Start profiles the process into path until stop is called; stop's error is the
// file's close, which is when a full disk shows. Errors name the flag.
func Start(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpuprofile: close %s: %w", path, err)
		}
		return nil
	}, nil
}
