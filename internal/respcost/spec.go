package respcost

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
)

// MaxCost is the largest cost one response can report. A larger reported
// whole number is counted as MaxCost and the Result says Clamped: a single
// response must not be able to push a key's window into a debt it can never
// leave, and the sum of a few such costs stays far inside int64.
const MaxCost = 1_000_000_000

// Caps on a Spec, so that matching a key costs a bounded, small amount of
// work and a Meter's path state fits in fixed arrays (no allocation per
// response).
const (
	// MaxFields is the most JSONFields a Spec may name: a bit per field in a
	// uint8. Real model servers need one to three.
	MaxFields = 8
	// MaxPaths is the most paths all JSONFields may name together,
	// alternatives included: a bit per path in a uint16.
	MaxPaths = 16
	// MaxPathSegments is the most dot-separated segments of one path.
	MaxPathSegments = 16
	// MaxFieldBytes is the longest JSONFields entry.
	MaxFieldBytes = 256
)

// Spec says where a response reports its cost. It is the policy's
// description; Compile checks it once and prepares it for many responses.
type Spec struct {
	// Header names a response header, else trailer, that holds the cost as a
	// whole number. It is checked first, when the response has ended: the
	// header, then the trailer (the first value of each); a value that is not
	// a whole number in plain digits is ignored (IssueIgnoredValue) and the
	// body is used; one above MaxCost counts as MaxCost. Empty: none.
	Header string
	// JSONFields are dot paths into a JSON object, e.g. "usage.total_tokens".
	// The cost is the sum of the fields found; for each field the last whole
	// number seen in the body wins (a JSON body, or the data of each Server-Sent
	// Event parsed as JSON). A field may list alternative paths separated by
	// "|": whichever of them is seen last gives the field's value. Anthropic
	// reports input tokens at usage.input_tokens in a response, at
	// message.usage.input_tokens in a stream's message_start and again,
	// cumulatively, at usage.input_tokens in some message_delta events, so
	// "usage.input_tokens|message.usage.input_tokens" counts them once in
	// both. Paths go through objects only (no array indexes); segments are
	// printable ASCII without spaces, dots or "|". Empty: the body is not
	// parsed.
	JSONFields []string
	// Default is the cost when the response reports none, in [0, MaxCost].
	Default int64
}

// Rule is a compiled Spec: immutable, safe for concurrent use, shared by
// all the Meters of one policy.
type Rule struct {
	header  string // canonical MIME header key; "" if none
	paths   []path
	def     int64
	all     uint16                  // a bit per path
	deeper  [MaxPathSegments]uint16 // paths with more than l segments: those a key at level l can match
	exactAt [MaxPathSegments]uint16 // paths with exactly l+1 segments: those a value at level l completes
}

type path struct {
	segs  []string
	field uint8 // the JSONFields entry the path belongs to
}

// Compile validates spec and prepares it for NewMeter. The errors name the
// offending field, so that a policy's status can quote them.
func Compile(spec Spec) (*Rule, error) {
	r := &Rule{def: spec.Default}
	if spec.Default < 0 || spec.Default > MaxCost {
		return nil, fmt.Errorf("respcost: default %d is outside [0, %d]", spec.Default, MaxCost)
	}
	if spec.Header != "" {
		if !isToken(spec.Header) {
			return nil, fmt.Errorf("respcost: header %q is not a valid HTTP header name", spec.Header)
		}
		r.header = textproto.CanonicalMIMEHeaderKey(spec.Header)
	}
	if len(spec.JSONFields) > MaxFields {
		return nil, fmt.Errorf("respcost: %d jsonFields, at most %d", len(spec.JSONFields), MaxFields)
	}
	seen := map[string]int{}
	for i, f := range spec.JSONFields {
		if f == "" {
			return nil, fmt.Errorf("respcost: jsonFields[%d] is empty", i)
		}
		if len(f) > MaxFieldBytes {
			return nil, fmt.Errorf("respcost: jsonFields[%d] is longer than %d bytes", i, MaxFieldBytes)
		}
		for _, p := range strings.Split(f, "|") {
			segs, err := splitPath(p)
			if err != nil {
				return nil, fmt.Errorf("respcost: jsonFields[%d] %q: path %q: %w", i, f, p, err)
			}
			if j, ok := seen[p]; ok {
				// The same value counted in two fields would be
				// charged twice.
				return nil, fmt.Errorf("respcost: jsonFields[%d] %q: path %q is already in jsonFields[%d]", i, f, p, j)
			}
			seen[p] = i
			if len(r.paths) == MaxPaths {
				return nil, fmt.Errorf("respcost: jsonFields name more than %d paths", MaxPaths)
			}
			bit := uint16(1) << len(r.paths)
			r.all |= bit
			for l := range segs {
				r.deeper[l] |= bit
			}
			r.exactAt[len(segs)-1] |= bit
			r.paths = append(r.paths, path{segs: segs, field: uint8(i)})
		}
	}
	return r, nil
}

// fieldBits maps a set of paths to the set of fields they belong to.
func (r *Rule) fieldBits(paths uint16) uint8 {
	var fs uint8
	for p := 0; paths != 0; p, paths = p+1, paths>>1 {
		if paths&1 != 0 {
			fs |= 1 << r.paths[p].field
		}
	}
	return fs
}

func splitPath(p string) ([]string, error) {
	if p == "" {
		return nil, fmt.Errorf("empty path")
	}
	segs := strings.Split(p, ".")
	if len(segs) > MaxPathSegments {
		return nil, fmt.Errorf("%d segments, at most %d", len(segs), MaxPathSegments)
	}
	for _, s := range segs {
		if s == "" {
			return nil, fmt.Errorf("empty segment (a leading, trailing or doubled dot)")
		}
		for k := 0; k < len(s); k++ {
			// Printable ASCII only: a key is matched byte by byte as it goes
			// by, and keeping segments ASCII makes that match equal to JSON
			// string equality (escapes decoding to ASCII are honoured; any
			// other byte can never equal a segment byte).
			if c := s[k]; c <= ' ' || c > '~' {
				return nil, fmt.Errorf("segment %q holds %q: only printable ASCII without spaces", s, c)
			}
		}
	}
	return segs, nil
}

// isToken reports whether s is an RFC 9110 token (a valid header name).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}

// Source says where a Result's cost came from; a label value for metrics.
type Source string

// The sources of a cost, in the order Cost tries them.
const (
	SourceHeader  Source = "header"
	SourceTrailer Source = "trailer"
	SourceBody    Source = "body"
	SourceDefault Source = "default"
)

// Issue is a set of reasons the response could not be measured in full.
// None of them is an error of the request: the cost is still what the
// response reported as far as it was read, else Default.
type Issue uint8

// The issues a Meter reports.
const (
	// IssueCut: the body was not read to its end (the client went away, the
	// upstream broke off, or the caller stopped reading). The cost is what
	// had been read.
	IssueCut Issue = 1 << iota
	// IssueEncoded: the body has a Content-Encoding (gzip, br, ...); it is
	// passed through but not decoded, so only the header, trailer or Default
	// can give the cost.
	IssueEncoded
	// IssueOverCap: part of the body exceeded a cap (MaxEventBytes,
	// MaxNumberBytes) and was passed through without being parsed.
	IssueOverCap
	// IssueMalformed: the body (or an SSE event's data) started as a JSON
	// object but broke JSON's grammar where the scanner follows it (inside
	// a value it skips it only counts brackets); the rest of it was not
	// parsed. Fields read before count for a JSON body; an SSE event
	// counts only if its data is a whole object.
	IssueMalformed
	// IssueIgnoredValue: a header, trailer or named field held something
	// other than a whole number in range (negative, fractional, exponent,
	// string, boolean, object): it was ignored, as if absent.
	IssueIgnoredValue
)

var issueNames = [...]string{"cut", "encoded", "over-cap", "malformed", "ignored-value"}

// String lists the issues, e.g. "cut,over-cap"; "" for none.
func (is Issue) String() string {
	var b strings.Builder
	for i, n := range issueNames {
		if is&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n)
		}
	}
	return b.String()
}

// Result is a response's cost and how it was found.
type Result struct {
	// Cost is in [0, MaxCost].
	Cost   int64
	Source Source
	// Clamped: the cost reported was above MaxCost (or, for several
	// fields, their sum was) and MaxCost was counted.
	Clamped bool
	// Issues say what kept the body from being measured in full; they are
	// reported even when the cost came from the header or trailer.
	Issues Issue
}

// headerCost reads a whole number from the first value of key in h.
// present is false when h has no value for key.
func headerCost(h http.Header, key string) (cost int64, clamped, present, valid bool) {
	vs := h[key]
	if len(vs) == 0 {
		return 0, false, false, false
	}
	v := strings.TrimSpace(vs[0])
	if v == "" || len(v) > MaxNumberBytes {
		return 0, false, true, false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false, true, false
		}
		cost = addDigit(cost, c)
	}
	if cost > MaxCost {
		return MaxCost, true, true, true
	}
	return cost, false, true, true
}

// addDigit appends a decimal digit to n, saturating just above MaxCost so
// that any number of digits neither overflows nor loses "too big".
func addDigit(n int64, c byte) int64 {
	n = n*10 + int64(c-'0')
	if n > MaxCost {
		return MaxCost + 1
	}
	return n
}
