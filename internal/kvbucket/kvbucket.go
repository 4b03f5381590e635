// Package kvbucket opens the JetStream KV buckets the dispenser's parts keep their
// state in.
package kvbucket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
)

// Open creates the bucket cfg describes, or binds to it when it exists (another node
// created it first). A bucket that exists with other settings is used as it is:
// callers that depend on one (a TTL) check it themselves. A server that refuses for a
// moment (a NATS cluster still electing its JetStream leader, a file store still
// removing the files of a bucket just deleted) is asked again a few times within ctx;
// a refusal no retry mends (permanent) is returned at once.
func Open(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	bo := backoff.New(backoff.Policy{Min: 50 * time.Millisecond, Max: time.Second, Jitter: 0.5})
	for {
		kv, err := js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
		if err == nil {
			return kv, nil
		}
		if permanent(err) || bo.Failures() >= 8 || !bo.Wait(ctx) {
			return nil, fmt.Errorf("open KV bucket %s: %w", cfg.Bucket, err)
		}
	}
}

// JetStream's error codes of a bucket that can never be created as asked: more replicas
// than a server that is not clustered keeps, and an account without JetStream.
const (
	errReplicasNotClustered jetstream.ErrorCode = 10074
	errJetStreamNotEnabled  jetstream.ErrorCode = 10039
)

// permanent reports whether err is a refusal a retry does not mend: the user may not
// use the bucket, or the server can never hold it as asked.
func permanent(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) && (api.ErrorCode == errReplicasNotClustered || api.ErrorCode == errJetStreamNotEnabled) {
		return true
	}
	return errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization)
}

// Gone reports whether err says the bucket (its stream) does not exist: deleted, or a
// JetStream that lost its store. nats.go says so in more than one way.
func Gone(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		(errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamNotFound)
}
