package wire

import "testing"

func TestNoResponders(t *testing.T) {
	for _, tt := range []struct {
		name   string
		header map[string][]string
		body   []byte
		want   bool
	}{
		{"NoResponders", map[string][]string{"Status": {"503"}}, nil, true},
		{"AnswerWithBody", map[string][]string{"Status": {"503"}}, []byte("1"), false},
		{"ServiceError", map[string][]string{ServiceErrorCodeHeader: {"503"}}, nil, false},
		{"OtherStatus", map[string][]string{"Status": {"408"}}, nil, false},
		{"NoHeader", nil, nil, false},
	} {
		if got := NoResponders(tt.header, tt.body); got != tt.want {
			t.Errorf("%s: NoResponders(%v, %q) = %v, want %v", tt.name, tt.header, tt.body, got, tt.want)
		}
	}
}

func TestKVNames(t *testing.T) {
	s := Subjects{Prefix: "leaf"}
	for _, tt := range []struct{ got, want string }{
		{s.Bucket(BucketSegments), "leaf_segments"},
		{s.Bucket(BucketForever), "leaf_forever"},
		{s.Bucket(DeploymentBucket), "leaf_deployment"},
		{KVStream(s.Bucket(BucketLeases)), "KV_leaf_leases"},
		{WorkerKey(3), "worker-3"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
