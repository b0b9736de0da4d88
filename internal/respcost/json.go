package respcost

import "bytes"

// What one JSON document may make the scanner hold: nothing is buffered.
// Keys are matched against the paths byte by byte as they go by, numbers
// are accumulated digit by digit, strings are skipped with
// bytes.IndexByte, and a value no path leads into (an array, an object
// whose key matched no path) is skipped by counting brackets. So nesting
// costs one counter, not a stack: the objects followed are those on a
// field's path, at most MaxPathSegments deep, and a document of any size
// or depth costs fixed memory and time linear in its length.
const (
	// MaxNumberBytes is the longest number token read as a cost: a
	// longer one (no cost needs more than 10 digits) is ignored
	// (IssueOverCap) and parsing goes on after it.
	MaxNumberBytes = 64
)

type jsState uint8

const (
	jsValue      jsState = iota // a value is expected
	jsObjFirst                  // after '{': a key or '}'
	jsObjKey                    // after ',' in an object: a key
	jsKey                       // inside a key
	jsKeyEsc                    // after '\' in a key
	jsKeyU                      // inside \uXXXX in a key
	jsColon                     // after a key
	jsString                    // inside a string value
	jsNumber                    // inside a number
	jsLiteral                   // inside true, false or null
	jsAfter                     // after a value inside an object
	jsSkip                      // inside an array or object no path leads into
	jsSkipString                // inside a string in it
	jsDone                      // the top-level object has ended
	jsStop                      // not parsing any more (see stopped)
)

// tally is what the named fields were last seen to hold.
type tally struct {
	vals    [MaxFields]int64
	found   uint8 // fields seen with a whole number
	clamped uint8 // fields whose value was clamped to MaxCost
}

// set records v for the fields in bits.
func (t *tally) set(bits uint8, v int64, clamped bool) {
	for f := range MaxFields {
		if bits&(1<<f) != 0 {
			t.vals[f] = v
		}
	}
	t.found |= bits
	if clamped {
		t.clamped |= bits
	} else {
		t.clamped &^= bits
	}
}

// overlay copies the fields o found over t: the later value wins.
func (t *tally) overlay(o *tally) {
	for f := range MaxFields {
		if o.found&(1<<f) != 0 {
			t.vals[f] = o.vals[f]
		}
	}
	t.found |= o.found
	t.clamped = t.clamped&^o.found | o.clamped
}

// jsonScanner finds the rule's fields in one JSON document fed to it in
// pieces of any size. It is lenient where leniency cannot change a field's
// value (it does not check that "true" is spelt right or that strings hold
// valid UTF-8, nor anything inside a value it skips) and strict about the
// structure it follows, so that a key is matched only where a JSON parser
// would see it.
type jsonScanner struct {
	rule  *Rule
	state jsState
	depth int // objects open and followed, at most MaxPathSegments
	// masks[l] are the paths a key of the object at level l may match.
	masks     [MaxPathSegments]uint16
	skipDepth int // brackets open in the value being skipped

	esc     bool   // the next byte of the string being skipped is escaped
	keyMask uint16 // paths the key being read still matches
	keyPos  int    // bytes of the key matched so far (saturates)
	keyU    uint16 // \uXXXX being read in a key
	keyUN   uint8  // hex digits of it read
	valMask uint16 // paths that lead to the value that comes next

	num      int64 // number being read, saturating at MaxCost+1
	numLen   int
	numWhole bool // only digits so far

	t      tally
	issues Issue
}

func (s *jsonScanner) reset(r *Rule) {
	issues := s.issues
	*s = jsonScanner{rule: r, issues: issues}
	// The top-level value's path is empty: every field may start there.
	s.valMask = r.all
}

// done reports whether a whole JSON object has been read.
func (s *jsonScanner) done() bool { return s.state == jsDone }

// started reports whether the document's first byte has been seen.
func (s *jsonScanner) started() bool { return s.state != jsValue || s.depth != 0 }

// open reports whether an object was begun and has not ended.
func (s *jsonScanner) open() bool { return s.started() && s.state != jsDone && s.state != jsStop }

// parsing reports whether more bytes can still change anything.
func (s *jsonScanner) parsing() bool { return s.state != jsStop }

func (s *jsonScanner) stop(is Issue) {
	s.state = jsStop
	s.issues |= is
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// pop closes the innermost object.
func (s *jsonScanner) pop() {
	s.depth--
	s.afterValue()
}

func (s *jsonScanner) afterValue() {
	if s.depth == 0 {
		s.state = jsDone
	} else {
		s.state = jsAfter
	}
}

// exact are the paths that end at the value about to be read.
func (s *jsonScanner) exact() uint16 {
	if l := s.depth - 1; l >= 0 && l < MaxPathSegments {
		return s.valMask & s.rule.exactAt[l]
	}
	return 0
}

// beginValue starts the value whose first byte is c.
func (s *jsonScanner) beginValue(c byte) {
	exact := s.exact()
	if s.depth == 0 && c != '{' {
		// Only an object can hold a named field: anything else (an
		// SSE "[DONE]", an array, a number) is passed over, silently.
		s.state = jsStop
		return
	}
	switch {
	case c == '{' || c == '[':
		if exact != 0 {
			s.issues |= IssueIgnoredValue
		}
		var next uint16
		if c == '{' && s.depth < MaxPathSegments {
			next = s.valMask & s.rule.deeper[s.depth]
		}
		if next == 0 {
			// No path leads in: skip it whole (paths do not index arrays).
			s.state, s.skipDepth = jsSkip, 1
			return
		}
		s.masks[s.depth] = next
		s.depth++
		s.state = jsObjFirst
	case c == '"':
		if exact != 0 {
			s.issues |= IssueIgnoredValue
		}
		s.state = jsString
	case c == '-' || '0' <= c && c <= '9':
		s.state = jsNumber
		s.num, s.numLen, s.numWhole = 0, 1, c != '-'
		if s.numWhole {
			s.num = int64(c - '0')
		}
	case 'a' <= c && c <= 'z':
		if exact != 0 && c != 'n' { // null is absent; true and false are not numbers
			s.issues |= IssueIgnoredValue
		}
		s.state = jsLiteral
	default:
		s.stop(IssueMalformed)
	}
}

// endNumber records the number just read if it is a field's value.
func (s *jsonScanner) endNumber() {
	exact := s.exact()
	s.afterValue()
	if exact == 0 {
		return
	}
	switch {
	case s.numLen > MaxNumberBytes:
		s.issues |= IssueOverCap
	case !s.numWhole:
		s.issues |= IssueIgnoredValue
	case s.num > MaxCost:
		s.t.set(s.rule.fieldBits(exact), MaxCost, true)
	default:
		s.t.set(s.rule.fieldBits(exact), s.num, false)
	}
}

// endKey decides which paths the key just read leads on.
func (s *jsonScanner) endKey() {
	l := s.depth - 1
	m := s.keyMask
	for f := 0; m != 0; f, m = f+1, m>>1 {
		if m&1 != 0 && len(s.rule.paths[f].segs[l]) != s.keyPos {
			s.keyMask &^= 1 << f
		}
	}
	s.valMask = s.keyMask
	s.state = jsColon
}

// keyByte matches one (decoded) byte of a key against the segments.
func (s *jsonScanner) keyByte(c byte) {
	l := s.depth - 1
	m := s.keyMask
	for f := 0; m != 0; f, m = f+1, m>>1 {
		if m&1 != 0 {
			seg := s.rule.paths[f].segs[l]
			if s.keyPos >= len(seg) || seg[s.keyPos] != c {
				s.keyMask &^= 1 << f
			}
		}
	}
	if s.keyMask != 0 {
		s.keyPos++
	}
}

// skipStops are the bytes that matter inside a skipped value.
var skipStops = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// closeQuote returns the index in p of the quote that ends the string
// being read, or -1 if p ends first. A quote is escaped if an odd run of
// backslashes comes before it, so one IndexByte per quote finds the end
// whatever the escapes; s.esc carries a pending escape from one piece of
// the body to the next. Each byte is looked at a bounded number of times
// (backslashes are counted back only to the previous quote).
func (s *jsonScanner) closeQuote(p []byte) int {
	i := 0
	if s.esc {
		if len(p) == 0 {
			return -1
		}
		s.esc, i = false, 1
	}
	for {
		q := bytes.IndexByte(p[i:], '"')
		if q < 0 {
			k := len(p)
			for k > i && p[k-1] == '\\' {
				k--
			}
			s.esc = (len(p)-k)%2 == 1
			return -1
		}
		j := i + q
		k := j
		for k > i && p[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			return j
		}
		i = j + 1
	}
}

// write scans p, the next bytes of the document.
func (s *jsonScanner) write(p []byte) {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch s.state {
		case jsString:
			j := s.closeQuote(p[i:])
			if j < 0 {
				return
			}
			i += j
			s.afterValue()
		case jsKey:
			if s.keyMask == 0 {
				// No path can match: only the end matters.
				j := s.closeQuote(p[i:])
				if j < 0 {
					return
				}
				i += j
				s.endKey()
				continue
			}
			switch c {
			case '"':
				s.endKey()
			case '\\':
				s.state = jsKeyEsc
			default:
				s.keyByte(c)
			}
		case jsKeyEsc:
			s.state = jsKey
			switch c {
			case '"', '\\', '/':
				s.keyByte(c)
			case 'b':
				s.keyByte('\b')
			case 'f':
				s.keyByte('\f')
			case 'n':
				s.keyByte('\n')
			case 'r':
				s.keyByte('\r')
			case 't':
				s.keyByte('\t')
			case 'u':
				s.state, s.keyU, s.keyUN = jsKeyU, 0, 0
			default:
				s.stop(IssueMalformed)
			}
		case jsKeyU:
			var h byte
			switch {
			case '0' <= c && c <= '9':
				h = c - '0'
			case 'a' <= c && c <= 'f':
				h = c - 'a' + 10
			case 'A' <= c && c <= 'F':
				h = c - 'A' + 10
			default:
				s.stop(IssueMalformed)
				continue
			}
			s.keyU = s.keyU<<4 | uint16(h)
			if s.keyUN++; s.keyUN == 4 {
				s.state = jsKey
				if s.keyU < 0x80 {
					s.keyByte(byte(s.keyU))
				} else {
					// Not ASCII, so it can equal no segment byte.
					s.keyMask = 0
				}
			}
		case jsNumber:
			// A tight loop: an embeddings response is mostly numbers.
			j, num, whole := i, s.num, s.numWhole
		digits:
			for ; j < len(p); j++ {
				switch c = p[j]; {
				case '0' <= c && c <= '9':
					if whole {
						num = addDigit(num, c)
					}
				case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-':
					whole = false
				default:
					break digits
				}
			}
			s.num, s.numWhole = num, whole
			s.numLen = min(s.numLen+j-i, MaxNumberBytes+1)
			if j == len(p) {
				return
			}
			s.endNumber()
			i = j - 1 // p[j] belongs to what follows the number
		case jsLiteral:
			if c < 'a' || c > 'z' {
				s.afterValue()
				i--
			}
		case jsSkip:
			j := i
			for ; j < len(p); j++ {
				c = p[j]
				if !skipStops[c] {
					continue
				}
				if c == '"' {
					s.state = jsSkipString
					break
				}
				if c == '{' || c == '[' {
					s.skipDepth++
					continue
				}
				if s.skipDepth--; s.skipDepth == 0 {
					s.afterValue()
					break
				}
			}
			i = j
		case jsSkipString:
			j := s.closeQuote(p[i:])
			if j < 0 {
				return
			}
			i += j
			s.state = jsSkip
		case jsStop:
			return
		default:
			if isSpace(c) {
				continue
			}
			s.structural(c)
		}
	}
}

// structural handles a non-space byte between tokens.
func (s *jsonScanner) structural(c byte) {
	switch s.state {
	case jsValue:
		s.beginValue(c)
	case jsObjFirst, jsObjKey:
		switch {
		case c == '"':
			s.state = jsKey
			s.keyPos = 0
			s.keyMask = s.masks[s.depth-1]
		case c == '}' && s.state == jsObjFirst:
			s.pop()
		default:
			s.stop(IssueMalformed)
		}
	case jsColon:
		if c != ':' {
			s.stop(IssueMalformed)
			return
		}
		s.state = jsValue
	case jsAfter:
		switch c {
		case ',':
			s.state = jsObjKey
		case '}':
			s.pop()
		default:
			s.stop(IssueMalformed)
		}
	case jsDone:
		// Bytes after the object: not one JSON document.
		s.stop(IssueMalformed)
	}
}
