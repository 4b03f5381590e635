package pools

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// Spec configures one pool: keep Depth ready batches of Size IDs of Kind and Tag.
type Spec struct {
	Kind  wire.Kind
	Tag   string
	Size  int
	Depth int
}

// MaxDepth bounds how many batches one pool may keep ready: with the largest batch
// this keeps a pool's memory bounded.
const MaxDepth = 4096

// maxConsumerName is the longest name JetStream gives a consumer: a pool's consumer
// (wire.PoolConsumer) must fit, which bounds how long a pool's encoded tag may be.
const maxConsumerName = 255

// ParseSpec reads the --pool form kind:tag:size:depth, e.g. segment:orders:1000:64. The
// tag is written in the subject encoding (wire.TagToken), so that a tag holding ':' or
// ',' (which separates pools in LEAFBUS_POOL) fits: segment:order%3Acreate:1000:64.
func ParseSpec(s string) (Spec, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return Spec{}, fmt.Errorf("pool %q: want kind:tag:size:depth, e.g. segment:orders:1000:64", s)
	}
	var sp Spec
	switch parts[0] {
	case "segment":
		sp.Kind = wire.Segment
	case "snowflake":
		sp.Kind = wire.Snowflake
	default:
		return Spec{}, fmt.Errorf("pool %q: kind %q is not segment or snowflake", s, parts[0])
	}
	tag, err := wire.ParseTagToken(parts[1])
	if err != nil {
		return Spec{}, fmt.Errorf("pool %q: %w: %w", s, segment.ErrInvalidTag, err)
	}
	sp.Tag = tag
	if c := wire.PoolConsumer(sp.Kind, tag); len(c) > maxConsumerName {
		return Spec{}, fmt.Errorf("pool %q: %w: the pool's consumer name %s would have %d characters, more than JetStream's %d", s, segment.ErrInvalidTag, wire.Quote(c), len(c), maxConsumerName)
	}
	size, err := strconv.Atoi(parts[2])
	if err != nil || size < 1 || size > wire.MaxBatchLimit {
		return Spec{}, fmt.Errorf("pool %q: size %q is not a whole number from 1 to %d", s, parts[2], wire.MaxBatchLimit)
	}
	depth, err := strconv.Atoi(parts[3])
	if err != nil || depth < 1 || depth > MaxDepth {
		return Spec{}, fmt.Errorf("pool %q: depth %q is not a whole number from 1 to %d", s, parts[3], MaxDepth)
	}
	sp.Size, sp.Depth = size, depth
	return sp, nil
}

// String is the --pool form ParseSpec reads, the tag as its subject token.
func (s Spec) String() string {
	return fmt.Sprintf("%s:%s:%d:%d", s.Kind, wire.TagToken(s.Tag), s.Size, s.Depth)
}

// Specs is a repeatable --pool flag.
type Specs []Spec

func (ss *Specs) String() string {
	if ss == nil {
		return ""
	}
	var parts []string
	for _, s := range *ss {
		parts = append(parts, s.String())
	}
	return strings.Join(parts, ",")
}

// Set adds one pool; a second pool of the same kind and tag is an error.
func (ss *Specs) Set(v string) error {
	sp, err := ParseSpec(v)
	if err != nil {
		return err
	}
	for _, have := range *ss {
		if have.Kind == sp.Kind && have.Tag == sp.Tag {
			return fmt.Errorf("pool %s: %s:%s is already configured as %s", sp, sp.Kind, sp.Tag, have)
		}
	}
	*ss = append(*ss, sp)
	return nil
}
