package respcost

import "bytes"

// MaxEventBytes is the most data one Server-Sent Event may carry and still
// be parsed. Nothing is buffered (data is scanned as it goes by), so the cap
// bounds no memory; it bounds the work spent on one event that will not hold
// a usage object: usage events are under 1 KiB, and a larger event (an image
// chunk, a whole document) is passed through unparsed (IssueOverCap).
const MaxEventBytes = 1 << 20

type sseState uint8

const (
	sseLineStart sseState = iota
	sseField              // reading a field name
	sseDataFirst          // after "data:", where one space is dropped
	sseData               // in a data line's value
	sseSkipLine           // in a comment or a field other than data
)

// sseScanner follows the event-stream format (WHATWG HTML, "Server-sent
// events"): lines end in CR, LF or CRLF; "data:" lines of one event are
// joined with LF; a blank line dispatches the event. Each event's data is
// fed to a fresh jsonScanner as it arrives; the event's field values count
// once the event is dispatched and its data was one whole JSON object.
// Other fields (event, id, retry) and comments are passed over; so is data
// that is not a JSON object, such as OpenAI's "[DONE]". A leading UTF-8
// BOM is not stripped (the first line then is no data line; no known server
// sends one).
type sseScanner struct {
	state    sseState
	afterCR  bool  // the last byte was CR: an LF now ends no new line
	fieldPos uint8 // bytes of "data" matched by the field name
	hasData  bool  // the event being read has a data line
	size     int   // data bytes of the event being read
	over     bool  // the event's data exceeded MaxEventBytes
	t        tally // fields of the events dispatched
}

const dataField = "data"

// lineEnd returns the index of the first CR or LF in p, or len(p).
func lineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	if n < 0 {
		n = len(p)
	}
	if r := bytes.IndexByte(p[:n], '\r'); r >= 0 {
		return r
	}
	return n
}

func (m *Meter) sseWrite(p []byte) {
	s := &m.sse
	for i := 0; i < len(p); i++ {
		c := p[i]
		if s.afterCR {
			s.afterCR = false
			if c == '\n' {
				continue
			}
		}
		if c == '\r' || c == '\n' {
			m.sseEndLine()
			s.afterCR = c == '\r'
			continue
		}
		switch s.state {
		case sseLineStart, sseField:
			if s.state == sseLineStart {
				s.state, s.fieldPos = sseField, 0
			}
			switch {
			case c == ':' && s.fieldPos == uint8(len(dataField)):
				m.sseBeginData()
				s.state = sseDataFirst
			case s.fieldPos < uint8(len(dataField)) && c == dataField[s.fieldPos]:
				s.fieldPos++
			default:
				s.state = sseSkipLine
			}
		case sseDataFirst, sseData:
			if s.state == sseDataFirst {
				s.state = sseData
				if c == ' ' {
					continue
				}
			}
			j := lineEnd(p[i:])
			m.sseFeed(p[i : i+j])
			i += j - 1
		case sseSkipLine:
			i += lineEnd(p[i:]) - 1
		}
	}
}

func (m *Meter) sseEndLine() {
	s := &m.sse
	switch {
	case s.state == sseLineStart:
		m.sseDispatch()
	case s.state == sseField && s.fieldPos == uint8(len(dataField)):
		// "data" alone on a line is a data line with an empty value.
		m.sseBeginData()
	}
	s.state = sseLineStart
}

func (m *Meter) sseBeginData() {
	s := &m.sse
	if s.hasData {
		m.sseFeed([]byte{'\n'})
		return
	}
	s.hasData, s.size, s.over = true, 0, false
	m.json.reset(m.rule)
}

func (m *Meter) sseFeed(b []byte) {
	s := &m.sse
	if s.over || !m.json.parsing() {
		return
	}
	s.size += len(b)
	if s.size > MaxEventBytes {
		s.over = true
		m.json.stop(IssueOverCap)
		return
	}
	m.json.write(b)
}

// sseComplete reports whether the event being read holds one whole JSON
// object whose fields count.
func (m *Meter) sseComplete() bool {
	return m.sse.hasData && !m.sse.over && m.json.done()
}

func (m *Meter) sseDispatch() {
	s := &m.sse
	if !s.hasData {
		return
	}
	if m.sseComplete() {
		s.t.overlay(&m.json.t)
	} else if m.json.open() {
		// The data began an object that never closed.
		m.json.issues |= IssueMalformed
	}
	s.hasData = false
}
