package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// NKeySeedFile writes a fresh NKey user's seed to a file in dir and returns its path and
// the seed, for a test that must find it nowhere.
func NKeySeedFile(tb testing.TB, dir string) (path, seed string) {
	tb.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		tb.Fatalf("create NKey user: %v", err)
	}
	s, err := kp.Seed()
	if err != nil {
		tb.Fatal(err)
	}
	path = filepath.Join(dir, "user.nk")
	if err := os.WriteFile(path, s, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path, string(s)
}

// CredsFile writes a .creds file (a user JWT signed by a fresh account, and the user's
// seed) to dir and returns its path and the seed. No server trusts it: it is for the
// checks made before connecting.
func CredsFile(tb testing.TB, dir string) (path, seed string) {
	tb.Helper()
	acc, err := nkeys.CreateAccount()
	if err != nil {
		tb.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		tb.Fatal(err)
	}
	token, err := jwt.NewUserClaims(pub).Encode(acc)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := user.Seed()
	if err != nil {
		tb.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(token, s)
	if err != nil {
		tb.Fatal(err)
	}
	path = filepath.Join(dir, "user.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path, string(s)
}
