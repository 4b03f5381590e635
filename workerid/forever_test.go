package workerid

import (
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

func TestForever(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 10*time.Second)
	f := openForever(t, env.js)
	_, err := f.Get(ctx, "n1")
	wantErrIs(t, "Get before Put", err, ErrNoRecord)

	want := Record{WorkerID: 3, Timestamp: 1763790000123}
	must(t, "Put", f.Put(ctx, "n1", want))
	got, err := f.Get(ctx, "n1")
	must(t, "Get", err)
	if got != want {
		t.Fatalf("Get = %+v, want %+v", got, want)
	}
	// PROTOCOL.md fixes the value's bytes.
	kv, err := env.js.KeyValue(ctx, "leaf_forever")
	must(t, "bind bucket", err)
	e, err := kv.Get(ctx, "n1")
	must(t, "raw Get", err)
	if string(e.Value()) != `{"worker_id":3,"timestamp":1763790000123}` {
		t.Fatalf("stored value = %s, want PROTOCOL.md's JSON", e.Value())
	}
	// A second OpenForever binds to the existing bucket.
	again := openForever(t, env.js)
	if got, err := again.Get(ctx, "n1"); err != nil || got != want {
		t.Fatalf("Get through a second OpenForever = %+v, %v; want %+v", got, err, want)
	}
}
