package segment

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// spellingRows are inserted by plain SQL, as Leaf's operators do, with max_id 1000*i+1
// and step 10; "Mixed" is stored in upper case and asked for in lower case.
var spellingRows = []string{"tiny", "Mixed", "strasse", "cafe", "com.acme.order", "order create", "订单"}

// otherSpellings are names some collation takes for one of spellingRows.
var otherSpellings = []string{
	"tİny", "tıny", "TİNY", "TINY", "Tiny", "ｔｉｎｙ", "tíny", "tiny ", "tiny  ",
	"mixed", "MIXED", "Mixed ",
	"straße", "STRASSE", "strase", "straſſe",
	"café", "CAFE", "cafe ",
	"COM.ACME.ORDER", "order create ",
	"tiny😀", // a 4-byte character: a utf8mb3 column cannot hold it
}

// TestMySQLTagSpellings: a tag is its row's stored bytes, whatever the table's
// collation (utf8mb4_general_ci, Leaf's usual; utf8mb4_unicode_ci; the case-sensitive
// utf8mb4_bin, which still ignores trailing spaces; utf8mb4_nopad_bin, where nothing
// folds). Every other spelling is either no tag (404) or, where the collation equates
// it with a row, refused with ErrTagSpelling naming the stored tag, by the store's
// Tag, Take, UpdateTag and AddTag and by the generator, and changes nothing: the row
// keeps its max_id and step, and its tag keeps serving with no repeat.
func TestMySQLTagSpellings(t *testing.T) {
	srv := testenv.MariaDB(t)
	for _, collation := range []string{"utf8mb4_general_ci", "utf8mb4_unicode_ci", "utf8mb4_bin", "utf8mb4_nopad_bin", "utf8mb3_general_ci"} {
		t.Run(collation, func(t *testing.T) {
			s := openMySQL(t, srv.NewDatabase(t))
			db := testenv.OpenDB(t, s.dsn)
			ctx := testCtx(t)
			if _, err := db.ExecContext(ctx, "ALTER TABLE leaf_alloc MODIFY biz_tag varchar(128) CHARACTER SET "+strings.Split(collation, "_")[0]+" COLLATE "+collation+" NOT NULL DEFAULT ''"); err != nil {
				t.Fatal(err)
			}
			for i, name := range spellingRows {
				if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES (?, ?, 10)", name, 1+1000*i); err != nil {
					t.Fatalf("insert %q: %v", name, err)
				}
			}
			cfg := testConfig(t, s)
			cfg.RefreshInterval = time.Hour
			cfg.Marks = NewInmemMarks()
			g, _ := startGenerator(t, cfg)
			served := map[int64]string{}
			serve := func(name string, want int64) {
				t.Helper()
				dst := make([]int64, 1)
				if err := g.Fill(ctx, name, dst); err != nil || dst[0] != want {
					t.Fatalf("Fill(%q) = %v, %v; want ID %d", name, dst, err, want)
				}
				if prev, dup := served[dst[0]]; dup {
					t.Fatalf("ID %d served twice, as %q and %q", dst[0], prev, name)
				}
				served[dst[0]] = name
			}
			for i, name := range spellingRows {
				serve(name, int64(1+1000*i))
			}

			refused := 0
			for _, spelling := range otherSpellings {
				stored, incomparable := storedAs(ctx, t, db, spelling)
				if stored == spelling {
					t.Fatalf("%q is a row of its own", spelling)
				}
				check := func(what string, err error) {
					t.Helper()
					switch {
					case incomparable && (!errors.Is(err, ErrInvalidTag) || errors.Is(err, ErrTagSpelling) || !strings.Contains(err.Error(), "cannot hold")):
						t.Errorf("%s(%q): %v, want ErrInvalidTag: the column cannot hold it", what, spelling, err)
					case incomparable:
					case stored == "" && !errors.Is(err, ErrTagNotFound):
						t.Errorf("%s(%q): %v, want ErrTagNotFound (the collation equates it with no row)", what, spelling, err)
					case stored != "" && (!errors.Is(err, ErrTagSpelling) || !errors.Is(err, ErrInvalidTag) ||
						err.Error() != CheckSpelling(spelling, stored).Error()):
						t.Errorf("%s(%q): %v, want ErrTagSpelling: %v", what, spelling, err, CheckSpelling(spelling, stored))
					}
				}
				_, err := s.Tag(ctx, spelling)
				check("Tag", err)
				_, err = s.Take(ctx, spelling, 0)
				check("Take", err)
				_, err = s.Take(ctx, spelling, 5)
				check("Take with a step", err)
				step, maxID := int64(99), int64(1<<40)
				_, err = s.UpdateTag(ctx, TagUpdate{Name: spelling, Step: &step, MaxID: &maxID})
				check("UpdateTag", err)
				_, err = s.UpdateTag(ctx, TagUpdate{Name: spelling, Step: &step})
				check("UpdateTag of the step", err)
				check("Fill", g.Fill(ctx, spelling, make([]int64, 1)))
				if incomparable {
					_, err = s.AddTag(ctx, Tag{Name: spelling, Step: 10})
					check("AddTag", err)
				}
				if stored == "" {
					continue
				}
				refused++
				_, err = s.AddTag(ctx, Tag{Name: spelling, Step: 10})
				if !errors.Is(err, ErrTagExists) || !strings.Contains(err.Error(), "stored as \""+stored+"\"") {
					t.Errorf("AddTag(%q) = %v, want ErrTagExists naming %q", spelling, err, stored)
				}
			}
			t.Logf("%s: %d of %d other spellings equated with a row and refused", collation, refused, len(otherSpellings))
			// Whatever folds, some spelling of each sort is refused: case (ci), trailing
			// spaces (PAD SPACE), ß, dotted İ and full-width letters (unicode_ci).
			wantRefused := map[string][]string{
				"utf8mb4_general_ci": {"TINY", "mixed", "tiny ", "tíny", "café", "tİny", "STRASSE"},
				"utf8mb4_unicode_ci": {"TINY", "mixed", "tiny ", "tíny", "ｔｉｎｙ", "straße", "tİny"},
				"utf8mb4_bin":        {"tiny ", "Mixed ", "cafe "},
				"utf8mb4_nopad_bin":  nil,
				"utf8mb3_general_ci": {"TINY", "tiny ", "tíny", "tİny"},
			}[collation]
			for _, spelling := range wantRefused {
				if stored, _ := storedAs(ctx, t, db, spelling); stored == "" {
					t.Errorf("%s does not equate %q with a row: the test no longer tries what it says", collation, spelling)
				}
			}

			// Nothing changed: every row has its max_id after the one segment served
			// and its step, and serves its next ID.
			for i, name := range spellingRows {
				row, err := s.Tag(ctx, name)
				if err != nil || row.MaxID != int64(11+1000*i) || row.Step != 10 {
					t.Errorf("row %q = %+v, %v; want max_id %d, step 10", name, row, err, 11+1000*i)
				}
				serve(name, int64(2+1000*i))
			}
			if st := g.Stats(); st.Tags != len(spellingRows) || st.Pending != 0 {
				t.Errorf("stats %+v: want one buffer per row, none pending", st)
			}
		})
	}
}

// storedAs is the row the collation of db's leaf_alloc takes name for, "" for none;
// incomparable when the column cannot compare name at all (a utf8mb3 column and a
// 4-byte character: "Illegal mix of collations").
func storedAs(ctx context.Context, t *testing.T, db *sql.DB, name string) (stored string, incomparable bool) {
	t.Helper()
	err := db.QueryRowContext(ctx, "SELECT biz_tag FROM leaf_alloc WHERE biz_tag = ?", name).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	if mysqlErrNumber(err) == mysqlErrCollationMix {
		return "", true
	}
	if err != nil {
		t.Fatal(err)
	}
	return stored, false
}
