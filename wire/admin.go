package wire

// The JSON shapes of the admin and decode subjects (PROTOCOL.md "Managing tags" and
// "Decoding a snowflake ID").

// TagInfo is a tag as the admin subjects show it. MaxID is also given as a string
// because JSON readers that use doubles lose precision above 2^53. Monotonic says the
// tag is served with the stronger ordering promise (PROTOCOL.md "Monotonic tags");
// Bits, Opaque and KeyFingerprint are its range (TagRange; PROTOCOL.md "Opaque tags and
// widths"): Bits is always given (63 by default), KeyFingerprint for an opaque tag only.
type TagInfo struct {
	Tag            string `json:"tag"`
	MaxID          int64  `json:"max_id"`
	MaxIDStr       string `json:"max_id_str"`
	Step           int64  `json:"step"`
	Description    string `json:"description"`
	UpdateTime     string `json:"update_time"`
	Monotonic      bool   `json:"monotonic"`
	Opaque         bool   `json:"opaque"`
	Bits           int    `json:"bits"`
	KeyFingerprint string `json:"key_fingerprint,omitempty"`
}

// Range is the tag's range as TagInfo shows it.
func (t TagInfo) Range() TagRange {
	return TagRange{Bits: t.Bits, Opaque: t.Opaque, Key: t.KeyFingerprint}.Normal()
}

// AddTagRequest is the body of <prefix>.admin.tags.add. Step is required; MaxID
// defaults to 1, Monotonic and Opaque to false, Bits to 63. An opaque tag's key is the
// key of the dispenser that answers (--id-key-file).
type AddTagRequest struct {
	Tag         string  `json:"tag"`
	Step        *int64  `json:"step,omitempty"`
	MaxID       *int64  `json:"max_id,omitempty"`
	Description *string `json:"description,omitempty"`
	Monotonic   *bool   `json:"monotonic,omitempty"`
	Opaque      *bool   `json:"opaque,omitempty"`
	Bits        *int    `json:"bits,omitempty"`
}

// UpdateTagRequest is the body of <prefix>.admin.tags.update: the tag and at least one
// of step, description, max_id, monotonic, opaque and bits. MaxID only ever raises a tag: it is how an operator
// repairs a tag whose store went backwards (a restored backup, a lost bucket) to above
// every dispenser's high-water mark. Bits changes the width of a tag that is not opaque;
// an opaque tag's range, and whether a tag is opaque, are fixed when it is added (Opaque
// and Bits may repeat them).
type UpdateTagRequest struct {
	Tag         string  `json:"tag"`
	Step        *int64  `json:"step,omitempty"`
	Description *string `json:"description,omitempty"`
	MaxID       *int64  `json:"max_id,omitempty"`
	Monotonic   *bool   `json:"monotonic,omitempty"`
	Opaque      *bool   `json:"opaque,omitempty"`
	Bits        *int    `json:"bits,omitempty"`
}

// DecodedID is the reply of <prefix>.decode.snowflake. Timestamp is Unix milliseconds
// (the epoch already added back); Time is the same instant in RFC 3339 with milliseconds.
type DecodedID struct {
	ID        string `json:"id"`
	Timestamp int64  `json:"timestamp"`
	Time      string `json:"time"`
	WorkerID  int64  `json:"worker_id"`
	Sequence  int64  `json:"sequence"`
}
