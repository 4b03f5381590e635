package dispenser

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/leafbus/leafbus/internal/boundedfile"
	"github.com/leafbus/leafbus/opaque"
)

// The ID key (PROTOCOL.md "Opaque tags and widths") keys the permutations of opaque
// tags. Every dispenser of a deployment must have the same one. It comes from a file
// (--id-key-file) or from the environment itself (LEAFBUS_ID_KEY, which has no flag, so
// that the key never stands on a command line and in the process list), as 32 to 128
// hex digits; `openssl rand -hex 32` makes one. It is never written to KV, the logs or
// $SRV: what is shown and recorded is its fingerprint (opaque.Fingerprint).

// IDKeyEnv is the environment variable that holds the ID key itself.
const IDKeyEnv = "LEAFBUS_ID_KEY"

// Bounds of a key in hex digits: 16 to 64 bytes.
const (
	minIDKeyHex = 2 * opaque.MinKeyBytes
	maxIDKeyHex = 128
)

// ParseIDKey reads a key as a key file or LEAFBUS_ID_KEY holds it: 32 to 128 hex
// digits, white space around them ignored. Its errors never quote the text, which may
// be most of a key.
func ParseIDKey(text []byte) ([]byte, error) {
	text = bytes.TrimSpace(text)
	if len(text) < minIDKeyHex || len(text) > maxIDKeyHex || len(text)%2 != 0 {
		return nil, fmt.Errorf("%d characters: want an even number of hex digits, %d to %d (16 to 64 bytes; `openssl rand -hex 32` makes one)", len(text), minIDKeyHex, maxIDKeyHex)
	}
	key := make([]byte, len(text)/2)
	if _, err := hex.Decode(key, text); err != nil {
		return nil, errors.New("not hex digits only (0-9, a-f): `openssl rand -hex 32` makes a key")
	}
	return key, nil
}

// checkIDKey checks that at most one source of the key is given, and the key itself
// when it is given in the environment.
func (c Config) checkIDKey() []error {
	switch {
	case c.IDKeyFile != "" && c.IDKey != "":
		return []error{fmt.Errorf("--id-key-file and %s are both given: give the ID key one way", IDKeyEnv)}
	case c.IDKey != "":
		if _, err := ParseIDKey([]byte(c.IDKey)); err != nil {
			return []error{fmt.Errorf("%s: %w", IDKeyEnv, err)}
		}
	}
	return nil
}

// LoadIDKey returns cfg's ID key: read from --id-key-file, or taken from IDKey; nil when
// neither is given. A file that others may read is said in warn (nil: not checked).
func LoadIDKey(cfg Config, warn func(msg string, args ...any)) ([]byte, error) {
	if cfg.IDKey != "" {
		key, err := ParseIDKey([]byte(cfg.IDKey))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", IDKeyEnv, err)
		}
		return key, nil
	}
	if cfg.IDKeyFile == "" {
		return nil, nil
	}
	text, err := boundedfile.Read("--id-key-file", cfg.IDKeyFile, 4096)
	if err != nil {
		return nil, fmt.Errorf("%w (a key file holds 32 to 128 hex digits)", err)
	}
	key, err := ParseIDKey(text)
	if err != nil {
		return nil, fmt.Errorf("--id-key-file %s: %w", cfg.IDKeyFile, err)
	}
	if st, err := os.Stat(cfg.IDKeyFile); err == nil && warn != nil && st.Mode().Perm()&0o077 != 0 {
		warn("the ID key file may be read by others than its owner: chmod 600 it", "file", cfg.IDKeyFile, "mode", st.Mode().Perm().String())
	}
	return key, nil
}

// loadIDKey is the step "id key": the key, and its fingerprint in the log.
func (d *Dispenser) loadIDKey(context.Context) error {
	key, err := LoadIDKey(d.cfg, d.log.Warn)
	if err != nil {
		return err
	}
	d.idKey = key
	if key != nil {
		d.log.Info("ID key of opaque tags loaded", "fingerprint", opaque.Fingerprint(key))
	}
	return nil
}
