package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/wire"
)

const revealUsage = `Usage: dispenser reveal --tag NAME [--bits N] [--id-key-file FILE] [flags] ID [ID ...]

Gives back the segment number behind each ID of the opaque tag NAME, one per line:
where in the tag's sequence, and so roughly when, the ID was handed out (docs/design.md
"Opaque tags"). It needs the deployment's ID key: --id-key-file, or the key itself in
LEAFBUS_ID_KEY. Without --bits it asks the deployment (leaf.admin.tags.list, with
--nats and the credential flags) for the tag's width and its key's fingerprint, and
refuses a key that is not the tag's; with --bits it asks nothing, and cannot tell a
wrong key (the numbers are then meaningless).

Flags:
`

// revealCommand is `dispenser reveal`: the permutation of an opaque tag run backwards,
// for support staff, with the key on this machine.
type revealCommand struct {
	cf      clientFlags
	tag     string
	bits    int
	keyFile string
	ids     []int64
	given   map[string]bool
}

func runReveal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &revealCommand{}
	if err := c.parse(args, stderr); err != nil {
		return err
	}
	key, err := dispenser.LoadIDKey(dispenser.Config{IDKeyFile: c.keyFile, IDKey: os.Getenv(dispenser.IDKeyEnv)}, nil)
	switch {
	case err != nil:
		return err
	case key == nil:
		return &usageError{fmt.Errorf("reveal: give the deployment's ID key: --id-key-file, or the key itself in %s", dispenser.IDKeyEnv)}
	}
	width := c.bits
	if !c.given["bits"] {
		if width, err = c.tagWidth(ctx, opaque.Fingerprint(key)); err != nil {
			return err
		}
	}
	p, err := opaque.New(key, c.tag, width)
	if err != nil {
		return &usageError{fmt.Errorf("reveal: %w", err)}
	}
	for _, id := range c.ids {
		n, err := p.Reveal(id)
		if err != nil {
			return &usageError{fmt.Errorf("reveal: ID %d: not an ID of a %d-bit tag (1 to %d)", id, width, p.Max())}
		}
		fmt.Fprintln(stdout, n)
	}
	return nil
}

// parse reads the flags, the environment and the IDs.
func (c *revealCommand) parse(args []string, stderr io.Writer) error {
	fs := newFlagSet("dispenser reveal", revealUsage, stderr)
	c.cf.register(fs)
	fs.StringVar(&c.tag, "tag", "", "the opaque tag")
	fs.IntVar(&c.bits, "bits", 63, "the tag's width; when given, the deployment is not asked")
	fs.StringVar(&c.keyFile, "id-key-file", "", "file holding the deployment's ID key (or the key itself in "+dispenser.IDKeyEnv+")")
	if err := parseSubcommand(fs, args, os.Getenv); err != nil {
		return err
	}
	c.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	if err := wire.CheckTag(c.tag); err != nil {
		return &usageError{fmt.Errorf("reveal: --tag: %w", err)}
	}
	if c.keyFile != "" && os.Getenv(dispenser.IDKeyEnv) != "" {
		return &usageError{fmt.Errorf("reveal: --id-key-file and %s are both given: give the ID key one way", dispenser.IDKeyEnv)}
	}
	if fs.NArg() == 0 {
		return &usageError{errors.New("reveal: want at least one ID")}
	}
	for _, arg := range fs.Args() {
		id, err := strconv.ParseInt(strings.TrimSpace(arg), 10, 64)
		if err != nil || id < 1 {
			return &usageError{fmt.Errorf("reveal: %q is not an ID from 1 to 9223372036854775807", arg)}
		}
		c.ids = append(c.ids, id)
	}
	return nil
}

// tagWidth asks the deployment for the tag: it must be opaque, under the key whose
// fingerprint is fp.
func (c *revealCommand) tagWidth(ctx context.Context, fp string) (int, error) {
	nc, cl, err := c.cf.connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	tags, err := cl.Tags(ctx)
	if err != nil {
		return 0, err
	}
	for _, t := range tags {
		if t.Tag != c.tag {
			continue
		}
		switch {
		case !t.Opaque:
			return 0, fmt.Errorf("reveal: tag %q is not opaque: its IDs are its segment numbers", c.tag)
		case t.KeyFingerprint != fp:
			return 0, fmt.Errorf("reveal: tag %q is opaque under the ID key with fingerprint %s, and the key given has the fingerprint %s: it is not the deployment's key", c.tag, t.KeyFingerprint, fp)
		}
		return t.Bits, nil
	}
	return 0, fmt.Errorf("reveal: the deployment has no tag %q", c.tag)
}
