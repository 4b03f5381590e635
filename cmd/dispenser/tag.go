package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/leafbus/leafbus/wire"
)

const tagUsage = `Usage: dispenser tag add --tag NAME --step N [--max-id N] [--description TEXT]
       dispenser tag list
       dispenser tag update --tag NAME [--step N] [--description TEXT]

Manages the segment tags of a running deployment over NATS (leaf.admin.tags.*).
add and update print the tag as JSON; list prints a table (--json for JSON).

Flags:
`

// runTag is `dispenser tag add|list|update`: a thin client of the admin subjects.
func runTag(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "add" && args[0] != "list" && args[0] != "update") {
		fmt.Fprint(stderr, tagUsage)
		return &usageError{fmt.Errorf("tag: want add, list or update")}
	}
	op := args[0]
	fs := newFlagSet("dispenser tag "+op, tagUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	var (
		name, description string
		step, maxID       int64
		asJSON            bool
	)
	if op != "list" {
		fs.StringVar(&name, "tag", "", "the tag (1-128 of A-Z a-z 0-9 _ -)")
		fs.Int64Var(&step, "step", 0, "segment length (1 to 10000000)")
		fs.StringVar(&description, "description", "", "what the IDs are for")
	}
	if op == "add" {
		fs.Int64Var(&maxID, "max-id", 1, "where the first segment starts")
	}
	if op == "list" {
		fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	}
	if err := parseSubcommand(fs, args[1:], os.Getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("tag %s: unexpected argument %q", op, fs.Arg(0))}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	nc, client, err := cf.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	switch op {
	case "add":
		if !given["step"] {
			return &usageError{fmt.Errorf("tag add: --step is required")}
		}
		r := wire.AddTagRequest{Tag: name, Step: &step, MaxID: &maxID}
		if given["description"] {
			r.Description = &description
		}
		t, err := client.AddTag(ctx, r)
		if err != nil {
			return err
		}
		return printJSON(stdout, t)
	case "update":
		r := wire.UpdateTagRequest{Tag: name}
		if given["step"] {
			r.Step = &step
		}
		if given["description"] {
			r.Description = &description
		}
		if r.Step == nil && r.Description == nil {
			return &usageError{fmt.Errorf("tag update: give --step and/or --description")}
		}
		t, err := client.UpdateTag(ctx, r)
		if err != nil {
			return err
		}
		return printJSON(stdout, t)
	}
	tags, err := client.Tags(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, tags)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TAG\tMAX_ID\tSTEP\tUPDATED\tDESCRIPTION")
	for _, t := range tags {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", t.Tag, t.MaxIDStr, t.Step, t.UpdateTime, t.Description)
	}
	return w.Flush()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
