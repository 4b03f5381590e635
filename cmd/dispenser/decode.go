package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

const decodeUsage = `Usage: dispenser decode [flags] ID

Asks a running deployment (leaf.decode.snowflake) to take a snowflake ID apart with
its layout and prints the JSON answer: timestamp, time, worker_id, sequence.

Flags:
`

// runDecode is `dispenser decode ID`.
func runDecode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dispenser decode", decodeUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	if err := parseSubcommand(fs, args, os.Getenv); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &usageError{fmt.Errorf("decode: want exactly one ID, got %d arguments", fs.NArg())}
	}
	id, err := strconv.ParseInt(strings.TrimSpace(fs.Arg(0)), 10, 64)
	if err != nil || id < 1 {
		return &usageError{fmt.Errorf("decode: %q is not an ID from 1 to 9223372036854775807", fs.Arg(0))}
	}
	nc, client, err := cf.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	d, err := client.Decode(ctx, id)
	if err != nil {
		return cf.namesUser(err, "an application's user (client-a) or operator")
	}
	return printJSON(stdout, d)
}
