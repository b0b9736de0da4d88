package respcost

import (
	"errors"
	"io"
	"net/http"
	"strings"
)

type mode uint8

const (
	modeNone mode = iota // headers, trailers and Default only
	modeJSON
	modeSSE
)

// Meter wraps a response body: Read passes the bytes through unchanged and
// parses them as they go by. It buffers nothing and allocates nothing after
// NewMeter. A Meter is not safe for concurrent use: call Cost after the
// last Read has returned.
type Meter struct {
	rule   *Rule
	header http.Header
	body   io.ReadCloser
	mode   mode
	eof    bool
	issues Issue
	json   jsonScanner
	sse    sseScanner
}

// NewMeter meters body, the body of a response with headers h. h's
// Content-Type picks the parser: application/json and any +json type, or
// text/event-stream; for any other type, and for a body with a
// Content-Encoding (it is not decoded), only the header, trailer or
// Default give the cost. h is read again by Cost, for the header.
func (r *Rule) NewMeter(h http.Header, body io.ReadCloser) *Meter {
	m := &Meter{rule: r, header: h, body: body}
	if len(r.paths) == 0 {
		return m
	}
	switch mediaType(h.Get("Content-Type")) {
	case modeJSON:
		m.mode = modeJSON
	case modeSSE:
		m.mode = modeSSE
	default:
		return m
	}
	if enc := h.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		m.mode = modeNone
		m.issues |= IssueEncoded
		return m
	}
	m.json.reset(r)
	return m
}

// mediaType maps a Content-Type to the parser for it.
func mediaType(ct string) mode {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	switch {
	case strings.EqualFold(ct, "application/json"):
		return modeJSON
	case len(ct) > len("+json") && strings.EqualFold(ct[len(ct)-len("+json"):], "+json") && strings.IndexByte(ct, '/') > 0:
		return modeJSON
	case strings.EqualFold(ct, "text/event-stream"):
		return modeSSE
	}
	return modeNone
}

// Read reads from the body into p and parses what it read. The bytes in p
// are the body's, unchanged; errors are the body's.
func (m *Meter) Read(p []byte) (int, error) {
	if m.body == nil {
		m.eof = true
		return 0, io.EOF
	}
	n, err := m.body.Read(p)
	if n > 0 && n <= len(p) {
		switch m.mode {
		case modeJSON:
			m.json.write(p[:n])
		case modeSSE:
			m.sseWrite(p[:n])
		}
	}
	if errors.Is(err, io.EOF) {
		m.eof = true
	}
	return n, err
}

// Close closes the body.
func (m *Meter) Close() error {
	if m.body == nil {
		return nil
	}
	return m.body.Close()
}

// Cost is the response's cost as far as it has been read: the Spec's
// header if it holds a whole number, else the same in trailer (the
// response's trailers, known once the body has been read to its end; nil
// if none), else the sum of the JSONFields found in the body, else Default.
// Call it when the response has ended, also when the client went away
// mid-stream: the cost is then what had been read (IssueCut). Cost does
// not change the Meter.
func (m *Meter) Cost(trailer http.Header) Result {
	res := Result{Issues: m.issues | m.json.issues}
	if !m.eof {
		res.Issues |= IssueCut
	} else if m.mode == modeJSON && m.json.open() {
		// The upstream ended the body inside the object.
		res.Issues |= IssueMalformed
	}
	if key := m.rule.header; key != "" {
		for _, src := range [...]struct {
			h      http.Header
			source Source
		}{{m.header, SourceHeader}, {trailer, SourceTrailer}} {
			v, clamped, present, valid := headerCost(src.h, key)
			if valid {
				res.Cost, res.Source, res.Clamped = v, src.source, clamped
				return res
			}
			if present {
				res.Issues |= IssueIgnoredValue
			}
		}
	}
	t := m.bodyTally()
	if t.found == 0 {
		res.Cost, res.Source = m.rule.def, SourceDefault
		return res
	}
	res.Source = SourceBody
	res.Clamped = t.clamped != 0
	for f := range MaxFields {
		if t.found&(1<<f) != 0 {
			res.Cost += t.vals[f]
		}
	}
	if res.Cost > MaxCost {
		res.Cost, res.Clamped = MaxCost, true
	}
	return res
}

// bodyTally is what the body reported so far.
func (m *Meter) bodyTally() tally {
	switch m.mode {
	case modeJSON:
		return m.json.t
	case modeSSE:
		t := m.sse.t
		if m.sseComplete() {
			// The last event is whole but its blank line has not come
			// (the stream was cut just before it): its usage counts.
			t.overlay(&m.json.t)
		}
		return t
	}
	return tally{}
}
