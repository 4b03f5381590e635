// Command printversion prints buildinfo.Read(): TestMakeRelease builds it with the
// Makefile's release linker flags, to see that they reach the package.
package main

import (
	"fmt"

	"github.com/leafbus/leafbus/internal/buildinfo"
)

func main() { fmt.Println(buildinfo.Read()) }
