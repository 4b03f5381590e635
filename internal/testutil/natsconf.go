package testutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The variables a nats-server configuration reads its passwords from, as
// deploy/nats-roles.conf names them, and its include lines.
var (
	confPasswordVar = regexp.MustCompile(`\$(NATS_[A-Z0-9_]+_PASSWORD)\b`)
	confInclude     = regexp.MustCompile(`(?m)^\s*include\s+"?([^"\s#]+)"?`)
)

// NATSConfPasswords sets, for tb's duration, every NATS_<USER>_PASSWORD variable that
// the nats-server configuration file path (and the files it includes) reads a password
// from, as an operator's secrets file would, and returns each variable's value. The
// values are "test-" and the variable's name in lower case, e.g. NATS_DISPENSER_PASSWORD
// is test-nats_dispenser_password. The server parses the file with them when it starts;
// tests read a user's password from the parsed options.
func NATSConfPasswords(tb testing.TB, path string) map[string]string {
	tb.Helper()
	vars := map[string]string{}
	var read func(string)
	read = func(file string) {
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatalf("read nats-server configuration: %v", err)
		}
		for _, m := range confPasswordVar.FindAllStringSubmatch(string(data), -1) {
			vars[m[1]] = "test-" + strings.ToLower(m[1])
		}
		for _, m := range confInclude.FindAllStringSubmatch(string(data), -1) {
			read(filepath.Join(filepath.Dir(file), m[1]))
		}
	}
	read(path)
	if len(vars) == 0 {
		tb.Fatalf("%s reads no NATS_<USER>_PASSWORD variable", path)
	}
	for k, v := range vars {
		tb.Setenv(k, v)
	}
	return vars
}
