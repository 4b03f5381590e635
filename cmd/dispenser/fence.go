package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/wire"
)

const fenceUsage = `Usage: dispenser fence [--margin N] [the dispenser's flags]

Makes a dispenser whose --data-dir was put back from a copy (a backup, a snapshot, a
copy from another host) safe before it serves again. In the embedded mode the data dir
holds the segment store and the high-water marks together, so an old copy put back
agrees with itself, and the IDs served after the copy was taken would be served again.
fence raises every tag's max_id to N above the higher of its max_id and this data dir's
mark (never past the largest int64), and records the fence in <data-dir>/segment.marks,
so what was served after the copy is never served again (up to N IDs per tag; the rest
is a gap). Run it with the flags of the dispenser, which must be stopped (fence takes
the data dir's lock), before that dispenser starts:

  dispenser fence --data-dir /var/lib/leafbus
  dispenser fence --data-dir /var/lib/leafbus --nats ... --segment-store mysql --mysql-dsn ...

Choose N above the most IDs any tag may have served since the copy was taken; the
default covers ten billion. A margin above 2^40, or one that would raise a tag to the
largest int64 (using it up for good), needs --confirm. The fence names tags this data
dir served that the store no longer has, and the max_id to add them back with.

Every row is checked before any is written. Rows no dispenser can serve (an empty
biz_tag, a control character: Leaf's table accepts them) are skipped and named. The
max_id of every tag is written to <data-dir>/fence.pending before the first row is
raised: an interrupted fence is finished by running it again (each tag raised to the
same max_id, none twice), and a dispenser refuses to start from the dir until then. A
second run after a finished fence raises every tag by N again: it cannot tell a repeat
from a data dir put back from a copy taken after the fence.

Flags:
`

func runFence(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := defaultConfig()
	fs := adminFlagSet(&cfg, "dispenser fence", fenceUsage, stderr)
	margin := fs.Int64("margin", dispenser.DefaultFenceMargin, "raise every tag this many IDs above max(max_id, mark)")
	confirm := fs.Bool("confirm", false, fmt.Sprintf("allow a --margin above %d, or one that raises a tag to the largest int64 (using it up)", dispenser.MaxUnconfirmedFenceMargin))
	if err := cfg.parseFlags(fs, args, os.Getenv); err != nil {
		return err
	}
	if err := dispenser.CheckFenceMargin(*margin, *confirm); err != nil {
		return &usageError{err}
	}
	report, err := dispenser.Fence(ctx, cfg.Config, *margin, *confirm, dispenser.WithLogger(cfg.logger(stderr)))
	for _, sk := range report.Skipped {
		fmt.Fprintf(stdout, "skipped %s: %s (no dispenser serves it; left as it is)\n", wire.Quote(sk.Tag), sk.Reason)
	}
	if len(report.Tags) == 0 && len(report.Missing) == 0 && err != nil {
		return err
	}
	if report.Resumed {
		fmt.Fprintf(stdout, "finished the fence begun at %s (margin %d): each tag raised to the max_id that run recorded\n",
			report.At.UTC().Format(time.RFC3339), report.Margin)
	}
	if !report.LastRecord.IsZero() {
		fmt.Fprintf(stdout, "the data dir's last record: %s (%v before the fence)\n",
			report.LastRecord.UTC().Format(time.RFC3339), report.At.Sub(report.LastRecord).Round(time.Second))
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TAG\tMAX_ID\tMARK\tFENCED_AT")
	for _, t := range report.Tags {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d%s\n", t.Tag, t.MaxID, t.Mark, t.To, capped(t))
	}
	for _, t := range report.Missing {
		fmt.Fprintf(w, "%s\t(missing)\t%d\t%d%s\n", t.Tag, t.Mark, t.To, capped(t))
	}
	if ferr := w.Flush(); ferr != nil {
		return ferr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fenced %d tags by %d; recorded in %s/%s\n", len(report.Tags), report.Margin, cfg.DataDir, dispenser.MarksFileName)
	return nil
}

func capped(t dispenser.FencedTag) string {
	if t.Capped {
		return " (the largest int64: the tag is used up)"
	}
	return ""
}
