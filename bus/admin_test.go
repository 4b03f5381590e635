package bus

import (
	"context"
	"testing"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// TestUpdateTagMaxID: the admin update raises a tag's max_id (the repair after a store
// went backwards) and refuses to lower it, with a 400 that says so.
func TestUpdateTagMaxID(t *testing.T) {
	store := segment.NewInmemStore()
	ctx := context.Background()
	if _, err := store.AddTag(ctx, segment.Tag{Name: "orders", Step: 10, MaxID: 100}); err != nil {
		t.Fatal(err)
	}
	s := adminService(t, store)
	for _, tt := range []struct {
		name, body string
		wantCode   int
		wantMaxID  int64
	}{
		{"OKRaise", `{"tag":"orders","max_id":5000}`, 0, 5000},
		{"OKSame", `{"tag":"orders","max_id":5000}`, 0, 5000},
		{"ErrLower", `{"tag":"orders","max_id":4999}`, 400, 5000},
		{"ErrZero", `{"tag":"orders","max_id":0}`, 400, 5000},
		{"ErrNothing", `{"tag":"orders"}`, 400, 5000},
		{"ErrMissing", `{"tag":"nope","max_id":9}`, 404, 5000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v, err := s.updateTag(ctx, []byte(tt.body))
			code := 0
			if err != nil {
				code, _ = core.CodeOf(err)
			}
			if code != tt.wantCode {
				t.Fatalf("update %s = %v, %v (code %d); want code %d", tt.body, v, err, code, tt.wantCode)
			}
			if code == 0 && v.(wire.TagInfo).MaxID != tt.wantMaxID {
				t.Fatalf("update %s = %+v, want max_id %d", tt.body, v, tt.wantMaxID)
			}
			tags, _ := store.Tags(ctx)
			if tags[0].MaxID != tt.wantMaxID {
				t.Fatalf("stored max_id %d after %s, want %d", tags[0].MaxID, tt.body, tt.wantMaxID)
			}
		})
	}
}
