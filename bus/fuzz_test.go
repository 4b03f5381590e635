package bus

import (
	"context"
	"testing"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/segment"
)

// FuzzAdminBodies feeds arbitrary bodies to the tag admin calls: whatever comes in, the
// answer is a tag or a 400/404/409 naming the problem, never a 500 and never a panic.
func FuzzAdminBodies(f *testing.F) {
	for _, s := range []string{
		`{"tag":"orders","step":1000}`, `{"tag":"orders","step":0}`, `{"tag":"a.b","step":1}`,
		`{"tag":"orders","step":1000,"max_id":9223372036854775807}`, `{"tag":"orders","stpe":1}`,
		`{"tag":"orders","description":"` + string(make([]byte, 300)) + `"}`, `[]`, `null`, `{} {}`, ``,
		`{"tag":"orders","step":1e3}`, `{"tag":"orders","step":-1}`, `{"tag":"orders","max_id":"1"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		store := segment.NewInmemStore()
		ctx := context.Background()
		if _, err := store.AddTag(ctx, segment.Tag{Name: "orders", Step: 10, MaxID: 1}); err != nil {
			t.Fatal(err)
		}
		s := adminService(t, store)
		for name, call := range map[string]func(context.Context, []byte) (any, error){"add": s.addTag, "update": s.updateTag} {
			if _, err := call(ctx, body); err != nil {
				if code, _ := core.CodeOf(err); code == 500 {
					t.Fatalf("%s %q: %v answers 500", name, body, err)
				}
			}
		}
	})
}
