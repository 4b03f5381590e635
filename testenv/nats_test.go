package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSRestartKeepsJetStream(t *testing.T) {
	n := testenv.StartNATS(t)
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "t"})
	if err != nil {
		t.Fatalf("CreateKeyValue: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	n.Restart()
	for {
		e, err := kv.Get(ctx, "k")
		if err == nil {
			if string(e.Value()) != "v" {
				t.Fatalf("Get after restart = %q, want %q", e.Value(), "v")
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("Get after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestNATSClusterR3KV(t *testing.T) {
	c := testenv.StartNATSCluster(t, 3)
	nc := c.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "t", Replicas: 3})
	if err != nil {
		t.Fatalf("CreateKeyValue R3: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
}
