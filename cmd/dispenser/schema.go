package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/workerid"
)

const schemaUsage = `Usage: dispenser schema

Prints the MySQL DDL: Leaf's leaf_alloc table, unchanged, so that a dispenser can take
over from (or run beside) an existing Leaf on the same rows; then the worker-ID table
that --worker-registry mysql uses (the improved Leaf fork's leaf_workerid_alloc).
Both statements are CREATE TABLE IF NOT EXISTS, so piping them into mysql is harmless
on a database that has them already:

  dispenser schema | mysql leaf
`

// runSchema is `dispenser schema`.
func runSchema(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dispenser schema", schemaUsage, stderr)
	if err := parseSubcommand(fs, args, os.Getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("schema: unexpected argument %q", fs.Arg(0))}
	}
	_, err := fmt.Fprintf(stdout, "-- segment store (--segment-store mysql): Leaf's own table\n%s\n"+
		"-- worker IDs (--worker-registry mysql only)\n%s;\n",
		strings.TrimSpace(segment.MySQLSchema), strings.TrimSuffix(strings.TrimSpace(workerid.MySQLRegistrySchema), ";"))
	return err
}
