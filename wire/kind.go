package wire

import "fmt"

// Kind is the kind of ID a subject asks for.
type Kind uint8

const (
	// Segment IDs come from a tag's number segments (Leaf-segment): increasing per tag.
	Segment Kind = iota
	// Snowflake IDs come from the time, the worker ID and a sequence (Leaf-snowflake).
	Snowflake
)

// The label values under which a dispenser counts its answers (metrics, $SRV.STATS):
// the transport that carried a request, and KindDecode, the kind of a decode request
// beside the Kinds' String.
const (
	TransportNATS = "nats"
	TransportHTTP = "http"
	KindDecode    = "decode"
)

func (k Kind) String() string {
	if k == Snowflake {
		return "snowflake"
	}
	return "segment"
}

// ParseKind reads "segment" or "snowflake".
func ParseKind(s string) (Kind, error) {
	switch s {
	case "segment":
		return Segment, nil
	case "snowflake":
		return Snowflake, nil
	}
	return 0, fmt.Errorf("kind %s: want segment or snowflake", Quote(s))
}

// Encoding is how a reply carries its IDs.
type Encoding uint8

const (
	// Text is the default: unsigned decimals separated by "\n", no trailing newline.
	Text Encoding = iota
	// Binary is N eight-byte big-endian unsigned integers.
	Binary
)

func (e Encoding) String() string {
	if e == Binary {
		return "binary"
	}
	return "text"
}

// ParseEncoding reads the Leaf-Encoding header value; "" means absent, which is text.
func ParseEncoding(v string) (Encoding, error) {
	switch v {
	case "", "text":
		return Text, nil
	case "binary":
		return Binary, nil
	}
	return 0, BadRequest("encoding %s is not text or binary", Quote(v))
}
