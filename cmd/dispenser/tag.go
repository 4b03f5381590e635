package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

const tagUsage = `Usage: dispenser tag add --tag NAME --step N [--max-id N] [--description TEXT] [--monotonic] [--opaque] [--bits N]
       dispenser tag list
       dispenser tag update --tag NAME [--step N] [--description TEXT] [--max-id N] [--monotonic=true|false] [--bits N]

Manages the segment tags of a running deployment over NATS (leaf.admin.tags.*).
add and update print the tag as JSON; list prints a table (--json for JSON).
update --max-id only ever raises max_id: it repairs a store that went backwards (docs/operations.md
"When the store goes backwards"); N must be at least every dispenser's high-water mark.
--monotonic marks a tag whose every reply is above every reply received before its
request was sent, across dispensers (docs/design.md "Trade-offs").
--opaque adds a tag whose IDs are the images of its segment numbers under a keyed
permutation (the answering dispenser's --id-key-file): unique, in no visible order
or density. --bits N keeps a tag's IDs below 2^N (53: every ID a JavaScript Number
holds exactly); an opaque tag's width is fixed when it is added (docs/design.md "Opaque tags").

Flags:
`

// tagCommand is `dispenser tag add|list|update`: a thin client of the admin subjects.
type tagCommand struct {
	op                string
	cf                clientFlags
	name, description string
	step, maxID       int64
	bits              int
	asJSON, monotonic bool
	opaque            bool
	given             map[string]bool // the flags on the command line
}

func runTag(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "add" && args[0] != "list" && args[0] != "update") {
		fmt.Fprint(stderr, tagUsage)
		return &usageError{fmt.Errorf("tag: want add, list or update")}
	}
	c := &tagCommand{op: args[0]}
	if err := c.parse(args[1:], stderr); err != nil {
		return err
	}
	nc, cl, err := c.cf.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	switch c.op {
	case "add":
		err = c.add(ctx, cl, stdout)
	case "update":
		err = c.update(ctx, cl, stdout)
	default:
		err = c.list(ctx, cl, stdout)
	}
	return c.cf.namesUser(err, "user operator")
}

// parse reads the flags of c.op and the environment.
func (c *tagCommand) parse(args []string, stderr io.Writer) error {
	fs := newFlagSet("dispenser tag "+c.op, tagUsage, stderr)
	c.cf.register(fs)
	if c.op != "list" {
		fs.StringVar(&c.name, "tag", "", "the tag (1-128 of A-Z a-z 0-9 _ -)")
		fs.Int64Var(&c.step, "step", 0, "segment length (1 to 10000000)")
		fs.StringVar(&c.description, "description", "", "what the IDs are for")
		fs.BoolVar(&c.monotonic, "monotonic", false, "every reply above every reply received before the request was sent, across dispensers")
	}
	switch c.op {
	case "add":
		fs.Int64Var(&c.maxID, "max-id", 1, "where the first segment starts")
		fs.BoolVar(&c.opaque, "opaque", false, "hand out the images of the segment numbers under the ID key's permutation: no visible order or density")
		fs.IntVar(&c.bits, "bits", 63, "width of the tag's IDs, 16 to 63 (53: exact in JavaScript)")
	case "update":
		fs.Int64Var(&c.maxID, "max-id", 0, "raise max_id (where the next segment starts) to N; never lowers it")
		fs.IntVar(&c.bits, "bits", 63, "change the width of a tag that is not opaque, 16 to 63")
	}
	if c.op == "list" {
		fs.BoolVar(&c.asJSON, "json", false, "print JSON instead of a table")
	}
	if err := parseSubcommand(fs, args, os.Getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("tag %s: unexpected argument %q", c.op, fs.Arg(0))}
	}
	c.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	return nil
}

func (c *tagCommand) add(ctx context.Context, cl *client.Client, stdout io.Writer) error {
	if !c.given["step"] {
		return &usageError{fmt.Errorf("tag add: --step is required")}
	}
	r := wire.AddTagRequest{Tag: c.name, Step: &c.step, MaxID: &c.maxID}
	r.Description = ifGiven(c.given, "description", &c.description)
	r.Monotonic = ifGiven(c.given, "monotonic", &c.monotonic)
	r.Opaque = ifGiven(c.given, "opaque", &c.opaque)
	r.Bits = ifGiven(c.given, "bits", &c.bits)
	t, err := cl.AddTag(ctx, r)
	if err != nil {
		return err
	}
	return printJSON(stdout, t)
}

func (c *tagCommand) update(ctx context.Context, cl *client.Client, stdout io.Writer) error {
	r := wire.UpdateTagRequest{Tag: c.name}
	r.Step = ifGiven(c.given, "step", &c.step)
	r.Description = ifGiven(c.given, "description", &c.description)
	r.MaxID = ifGiven(c.given, "max-id", &c.maxID)
	r.Monotonic = ifGiven(c.given, "monotonic", &c.monotonic)
	r.Bits = ifGiven(c.given, "bits", &c.bits)
	if r.Step == nil && r.Description == nil && r.MaxID == nil && r.Monotonic == nil && r.Bits == nil {
		return &usageError{fmt.Errorf("tag update: give --step, --description, --max-id, --monotonic and/or --bits")}
	}
	t, err := cl.UpdateTag(ctx, r)
	if err != nil {
		return err
	}
	return printJSON(stdout, t)
}

func (c *tagCommand) list(ctx context.Context, cl *client.Client, stdout io.Writer) error {
	tags, err := cl.Tags(ctx)
	if err != nil {
		return err
	}
	if c.asJSON {
		return printJSON(stdout, tags)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TAG\tMAX_ID\tSTEP\tMONOTONIC\tOPAQUE\tBITS\tUPDATED\tDESCRIPTION")
	for _, t := range tags {
		fmt.Fprintf(w, "%s\t%s\t%d\t%v\t%v\t%d\t%s\t%s\n", t.Tag, t.MaxIDStr, t.Step, t.Monotonic, t.Opaque, t.Bits, t.UpdateTime, t.Description)
	}
	return w.Flush()
}

// ifGiven is v when the flag name was on the command line (or in the environment),
// else nil: the request leaves that field as it is.
func ifGiven[T any](given map[string]bool, name string, v *T) *T {
	if given[name] {
		return v
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
