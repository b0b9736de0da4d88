package respcost

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Specs for the common model servers, as a policy would state them.
var (
	openAISpec = Spec{JSONFields: []string{"usage.total_tokens"}, Default: 100}
	// Anthropic: input and output tokens, each found at the response's
	// usage, in message_start's message.usage, and (cumulatively) in
	// message_delta's usage; the last one seen wins.
	anthropicSpec = Spec{
		JSONFields: []string{
			"usage.input_tokens|message.usage.input_tokens",
			"usage.output_tokens|message.usage.output_tokens",
		},
		Default: 100,
	}
	headerSpec = Spec{Header: "X-Cost", JSONFields: []string{"usage.total_tokens"}, Default: 100}
)

const (
	ctJSON = "application/json"
	ctSSE  = "text/event-stream"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// upTo returns b up to and including the first occurrence of s.
func upTo(t testing.TB, b []byte, s string) int {
	t.Helper()
	i := bytes.Index(b, []byte(s))
	if i < 0 {
		t.Fatalf("%q not in fixture", s)
	}
	return i + len(s)
}

type meterCase struct {
	name    string
	spec    Spec
	header  http.Header // response headers besides Content-Type
	ctype   string
	body    []byte
	nilBody bool
	cut     int   // the reader stops after this many bytes (the client went away); -1: read to the end
	err     error // the upstream breaks off with this error after the body's bytes
	trailer http.Header
	want    Result
	big     bool // too large to split at every byte
}

// anthropicRepeat is a stream whose message_delta repeats the input
// tokens, as the API does with server tools and as some gateways do.
const anthropicRepeat = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":25,\"output_tokens\":15}}\n\n"

func meterCases(t testing.TB) []meterCase {
	openAIChat := fixture(t, "openai_chat.json")
	openAIStream := fixture(t, "openai_stream.sse")
	anthropicMsg := fixture(t, "anthropic_messages.json")
	anthropicStream := fixture(t, "anthropic_stream.sse")
	anthropicCRLF := fixture(t, "anthropic_stream_crlf.sse")
	noUsage := bytes.Replace(openAIChat, []byte(`"usage"`), []byte(`"usage_"`), 1)
	usageChunk := `"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":8,"total_tokens":17`

	tenMB := 10 << 20
	bigLineSSE := "data: {\"pad\":\"" + strings.Repeat("x", tenMB) + "\"}\n\n" +
		"data: {\"usage\":{\"total_tokens\":5}}\n\n"
	bigLineJSON := "{\"pad\":\"" + strings.Repeat("x", tenMB) + "\",\"usage\":{\"total_tokens\":5}}"
	deep := strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000)
	deepArr := strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)

	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	body := func(r Result) Result { r.Source = SourceBody; return r }
	def := func(is Issue) Result { return Result{Cost: 100, Source: SourceDefault, Issues: is} }

	return []meterCase{
		// Model servers.
		{name: "openai chat completion", spec: openAISpec, ctype: "application/json; charset=utf-8", body: openAIChat, want: body(Result{Cost: 1163})},
		{name: "openai stream with final usage chunk", spec: openAISpec, ctype: ctSSE, body: openAIStream, want: body(Result{Cost: 17})},
		{name: "openai stream, charset", spec: openAISpec, ctype: "Text/Event-Stream; charset=utf-8", body: openAIStream, want: body(Result{Cost: 17})},
		{name: "anthropic message (a usage in a tool's input, inside an array, is not the usage)", spec: anthropicSpec, ctype: ctJSON, body: anthropicMsg, want: body(Result{Cost: 2095 + 503})},
		{name: "anthropic stream: message_start input, message_delta output", spec: anthropicSpec, ctype: ctSSE, body: anthropicStream, want: body(Result{Cost: 25 + 15})},
		{name: "anthropic stream, CRLF, two message_delta, the last with cumulative input", spec: anthropicSpec, ctype: ctSSE, body: anthropicCRLF, want: body(Result{Cost: 10682 + 510})},

		// Alternatives, paired with the naive spec that sums every path.
		{name: "anthropic stream repeating input in message_delta: alternatives count it once", spec: anthropicSpec, ctype: ctSSE, body: []byte(anthropicRepeat),
			want: body(Result{Cost: 25 + 15})},
		{name: "naive: the same stream with each path its own field charges input twice", ctype: ctSSE, body: []byte(anthropicRepeat),
			spec: Spec{JSONFields: []string{"usage.input_tokens", "message.usage.input_tokens", "usage.output_tokens", "message.usage.output_tokens"}},
			want: body(Result{Cost: 25 + 25 + 15 + 1})},

		// Header and trailer.
		{name: "header cost wins over the body", spec: headerSpec, ctype: ctJSON, header: hdr("x-cost", " 42 "), body: openAIChat, want: Result{Cost: 42, Source: SourceHeader}},
		{name: "trailer cost", spec: headerSpec, ctype: ctJSON, body: openAIChat, trailer: hdr("X-Cost", "7"), want: Result{Cost: 7, Source: SourceTrailer}},
		{name: "header cost on a body not parsed", spec: Spec{Header: "x-cost"}, ctype: "image/png", header: hdr("X-Cost", "3"), body: []byte("\x89PNG..."), want: Result{Cost: 3, Source: SourceHeader}},
		{name: "header not a number, trailer is", spec: headerSpec, ctype: ctJSON, header: hdr("X-Cost", "abc"), trailer: hdr("X-Cost", "8"), body: openAIChat, want: Result{Cost: 8, Source: SourceTrailer, Issues: IssueIgnoredValue}},
		{name: "negative header falls back to the body", spec: headerSpec, ctype: ctJSON, header: hdr("X-Cost", "-5"), body: openAIChat, want: body(Result{Cost: 1163, Issues: IssueIgnoredValue})},
		{name: "fractional trailer falls back to Default", spec: headerSpec, ctype: ctJSON, trailer: hdr("X-Cost", "1.5"), body: noUsage, want: def(IssueIgnoredValue)},
		{name: "huge header is clamped", spec: headerSpec, ctype: ctJSON, header: hdr("X-Cost", "99999999999999999999"), body: openAIChat, want: Result{Cost: MaxCost, Source: SourceHeader, Clamped: true}},
		{name: "header over the number cap is ignored", spec: headerSpec, ctype: ctJSON, header: hdr("X-Cost", strings.Repeat("9", MaxNumberBytes+1)), body: noUsage, want: def(IssueIgnoredValue)},
		{name: "the first header value counts", spec: headerSpec, ctype: ctJSON, header: hdr("X-Cost", "4", "X-Cost", "9"), body: openAIChat, want: Result{Cost: 4, Source: SourceHeader}},

		// No usage.
		{name: "upstream omits usage", spec: openAISpec, ctype: ctJSON, body: noUsage, want: def(0)},
		{name: "stream without include_usage", spec: openAISpec, ctype: ctSSE, body: bytes.Replace(openAIStream, []byte(`"usage":{`), []byte(`"usage_":{`), 1), want: def(0)},
		{name: "usage null", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":null}`), want: def(0)},
		{name: "empty body", spec: openAISpec, ctype: ctJSON, want: def(0)},
		{name: "nil body", spec: openAISpec, ctype: ctJSON, nilBody: true, want: def(0)},
		{name: "other content type is not parsed", spec: openAISpec, ctype: "text/plain", body: []byte(`{"usage":{"total_tokens":5}}`), want: def(0)},
		{name: "no content type is not parsed", spec: openAISpec, body: []byte(`{"usage":{"total_tokens":5}}`), want: def(0)},
		{name: "+json is parsed", spec: openAISpec, ctype: "application/vnd.example+json", body: []byte(`{"usage":{"total_tokens":5}}`), want: body(Result{Cost: 5})},
		{name: "gzip is not decoded", spec: openAISpec, ctype: ctJSON, header: hdr("Content-Encoding", "gzip"), body: []byte("\x1f\x8b\x08\x00garbage"), want: def(IssueEncoded)},
		{name: "identity encoding is parsed", spec: openAISpec, ctype: ctJSON, header: hdr("Content-Encoding", "identity"), body: []byte(`{"usage":{"total_tokens":5}}`), want: body(Result{Cost: 5})},
		{name: "a top-level array is passed over", spec: openAISpec, ctype: ctJSON, body: []byte(`[{"usage":{"total_tokens":5}}]`), want: def(0)},

		// Values.
		{name: "ignored values: negative, fraction, exponent, string, boolean, object", spec: Spec{JSONFields: []string{"a", "b", "c", "d", "e", "f"}, Default: 100}, ctype: ctJSON,
			body: []byte(`{"a":-3,"b":2.5,"c":1e3,"d":"4","e":true,"f":{"g":1}}`), want: def(IssueIgnoredValue)},
		{name: "zero and leading zeros count", spec: Spec{JSONFields: []string{"a", "b"}, Default: 100}, ctype: ctJSON, body: []byte(`{"a":0,"b":0012}`), want: body(Result{Cost: 12})},
		{name: "value above MaxCost is clamped", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":1000000001}}`), want: body(Result{Cost: MaxCost, Clamped: true})},
		{name: "sum above MaxCost is clamped", spec: anthropicSpec, ctype: ctJSON, body: []byte(`{"usage":{"input_tokens":999999999,"output_tokens":999999999}}`), want: body(Result{Cost: MaxCost, Clamped: true})},
		{name: "number over the cap is ignored", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":` + strings.Repeat("1", 100) + `}}`), want: def(IssueOverCap)},
		{name: "the last value wins", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5},"usage":{"total_tokens":7}}`), want: body(Result{Cost: 7})},
		{name: "a clamped value overwritten is not clamped", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5000000000,"total_tokens":7}}`), want: body(Result{Cost: 7})},
		{name: "an ignored value does not erase an earlier one", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5,"total_tokens":"x"}}`), want: body(Result{Cost: 5, Issues: IssueIgnoredValue})},
		{name: "keys match whole segments only", spec: openAISpec, ctype: ctJSON,
			body: []byte(`{"usagex":{"total_tokens":1},"usage":{"total_tokens_x":2,"total":3,"x":{"total_tokens":4}},"usage.total_tokens":5,"x":{"usage":{"total_tokens":6}}}`), want: def(0)},
		{name: "escaped key decoding to ASCII matches", spec: openAISpec, ctype: ctJSON, body: []byte(`{"\u0075sage":{"total\u005Ftokens":9}}`), want: body(Result{Cost: 9})},
		{name: "escaped non-ASCII key does not", spec: openAISpec, ctype: ctJSON, body: []byte(`{"us\u00e4ge":{"total_tokens":9}}`), want: def(0)},
		{name: "strings with escaped quotes do not end early", spec: openAISpec, ctype: ctJSON, body: []byte(`{"s":"a\"b\\","usage":{"total_tokens":9},"t":"\"usage\":{\"total_tokens\":1}"}`), want: body(Result{Cost: 9})},
		{name: "runs of backslashes before quotes", spec: openAISpec, ctype: ctJSON,
			body: []byte(`{"s":"\\\\\"\\\\","x\\\"":[{"t":"\\\"]"}],"usage":{"total_tokens":9},"u":"\"usage\\\":{\"total_tokens\":1}"}`), want: body(Result{Cost: 9})},
		{name: "whitespace everywhere", spec: openAISpec, ctype: ctJSON, body: []byte(" \r\n\t{ \"usage\" : { \"total_tokens\" : 9 } , \"a\" : [ 1 , { } , [ ] ] } \n"), want: body(Result{Cost: 9})},

		// Broken bodies.
		{name: "garbage after the object", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5}} {"usage":{"total_tokens":6}}`), want: body(Result{Cost: 5, Issues: IssueMalformed})},
		{name: "malformed before usage", spec: openAISpec, ctype: ctJSON, body: []byte(`{"a":1,,"usage":{"total_tokens":5}}`), want: def(IssueMalformed)},
		{name: "mismatched brackets on a path", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5]}`), want: body(Result{Cost: 5, Issues: IssueMalformed})},
		{name: "lenient: brackets in a skipped value are counted, not matched", spec: openAISpec, ctype: ctJSON, body: []byte(`{"a":[1},"usage":{"total_tokens":5}}`), want: body(Result{Cost: 5})},
		{name: "upstream ends the body inside the object", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5,"x":`), want: body(Result{Cost: 5, Issues: IssueMalformed})},
		{name: "a number cut by the end of the body does not count", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":5`), want: def(IssueMalformed)},

		// SSE details.
		{name: "sse [DONE] only", spec: openAISpec, ctype: ctSSE, body: []byte("data: [DONE]\n\n"), want: def(0)},
		{name: "sse data lines of one event are joined", spec: openAISpec, ctype: ctSSE, body: []byte("data: {\"usage\":\ndata:{\"total_tokens\":3}}\n\n"), want: body(Result{Cost: 3})},
		{name: "sse comments, other fields, bare data line, CR line ends", spec: openAISpec, ctype: ctSSE,
			body: []byte(": keep-alive\rid: 1\rretry: 10\revent: usage\rdatax: {\"usage\":{\"total_tokens\":1}}\rdata\rdata: {\"usage\":{\"total_tokens\":4}}\r\r"), want: body(Result{Cost: 4})},
		{name: "sse data: without space", spec: openAISpec, ctype: ctSSE, body: []byte("data:{\"usage\":{\"total_tokens\":6}}\n\n"), want: body(Result{Cost: 6})},
		{name: "sse the last event wins", spec: openAISpec, ctype: ctSSE, body: []byte("data: {\"usage\":{\"total_tokens\":6}}\n\ndata: {\"usage\":{\"total_tokens\":8}}\n\n"), want: body(Result{Cost: 8})},
		{name: "sse two objects in one event count for nothing", spec: openAISpec, ctype: ctSSE, body: []byte("data: {\"usage\":{\"total_tokens\":6}}\ndata: {}\n\n"), want: def(IssueMalformed)},
		{name: "sse an unclosed object counts for nothing", spec: openAISpec, ctype: ctSSE, body: []byte("data: {\"usage\":{\"total_tokens\":6}\n\n"), want: def(IssueMalformed)},
		{name: "sse empty data is passed over", spec: openAISpec, ctype: ctSSE, body: []byte("data:\n\ndata: \n\n"), want: def(0)},
		{name: "sse last event without its blank line at EOF counts", spec: openAISpec, ctype: ctSSE, body: []byte("data: {\"usage\":{\"total_tokens\":6}}"), want: body(Result{Cost: 6})},

		// Disconnects: whatever was read so far.
		{name: "anthropic stream cut before message_delta", spec: anthropicSpec, ctype: ctSSE, body: anthropicStream, cut: upTo(t, anthropicStream, `"text":"Hello"}}`),
			want: body(Result{Cost: 25 + 1, Issues: IssueCut})},
		{name: "openai stream cut before the usage chunk", spec: openAISpec, ctype: ctSSE, body: openAIStream, cut: upTo(t, openAIStream, `"finish_reason":"stop"`), want: def(IssueCut)},
		{name: "openai stream cut inside the usage chunk", spec: openAISpec, ctype: ctSSE, body: openAIStream, cut: upTo(t, openAIStream, usageChunk), want: def(IssueCut)},
		{name: "openai stream cut after the usage chunk's object, before its blank line", spec: openAISpec, ctype: ctSSE, body: openAIStream,
			cut: upTo(t, openAIStream, usageChunk+`,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`), want: body(Result{Cost: 17, Issues: IssueCut})},
		{name: "json cut after usage", spec: openAISpec, ctype: ctJSON, body: openAIChat, cut: upTo(t, openAIChat, `"total_tokens": 1163,`), want: body(Result{Cost: 1163, Issues: IssueCut})},
		{name: "upstream breaks off mid-stream", spec: anthropicSpec, ctype: ctSSE, body: anthropicStream[:upTo(t, anthropicStream, "message_delta")], err: io.ErrUnexpectedEOF,
			want: body(Result{Cost: 25 + 1, Issues: IssueCut})},
		{name: "trailer of a cut stream still counts", spec: headerSpec, ctype: ctSSE, body: openAIStream, cut: 10, trailer: hdr("X-Cost", "3"), want: Result{Cost: 3, Source: SourceTrailer, Issues: IssueCut}},

		// Hostile upstreams.
		{name: "10 MB single SSE line is passed over, later events count", spec: openAISpec, ctype: ctSSE, body: []byte(bigLineSSE), big: true, want: body(Result{Cost: 5, Issues: IssueOverCap})},
		{name: "10 MB JSON body is parsed whole", spec: openAISpec, ctype: ctJSON, body: []byte(bigLineJSON), big: true, want: body(Result{Cost: 5})},
		{name: "100k-deep objects, then usage", spec: openAISpec, ctype: ctJSON, body: []byte(`{"a":` + deep + `,"usage":{"total_tokens":1}}`), big: true, want: body(Result{Cost: 1})},
		{name: "100k-deep arrays, then usage", spec: openAISpec, ctype: ctJSON, body: []byte(`{"x":` + deepArr + `,"usage":{"total_tokens":1}}`), big: true, want: body(Result{Cost: 1})},
		{name: "100k-deep along a path", spec: Spec{JSONFields: []string{"a.a.a.a"}, Default: 100}, ctype: ctJSON, body: []byte(deep), big: true, want: def(IssueIgnoredValue)},
		{name: "100k-deep SSE event, later events count", spec: openAISpec, ctype: ctSSE, body: []byte("data: " + deep + "\n\ndata: {\"usage\":{\"total_tokens\":2}}\n\n"), big: true,
			want: body(Result{Cost: 2})},
		{name: "100k unclosed brackets, cut", spec: openAISpec, ctype: ctJSON, body: []byte(`{"usage":{"total_tokens":3},"x":` + strings.Repeat("[{", 50_000)), big: true,
			want: body(Result{Cost: 3, Issues: IssueMalformed})},
		{name: "the deepest path", spec: Spec{JSONFields: []string{strings.Repeat("a.", MaxPathSegments-1) + "a"}, Default: 100}, ctype: ctJSON,
			body: []byte(strings.Repeat(`{"a":`, MaxPathSegments) + "4" + strings.Repeat("}", MaxPathSegments)), want: body(Result{Cost: 4})},
		{name: "brackets inside strings inside skipped values", spec: openAISpec, ctype: ctJSON, body: []byte(`{"x":[{"s":"]}\"]}"},"[{"],"usage":{"total_tokens":6}}`), want: body(Result{Cost: 6})},
		{name: "10 MB SSE field name", spec: openAISpec, ctype: ctSSE, body: []byte(strings.Repeat("d", tenMB) + ": x\n\ndata: {\"usage\":{\"total_tokens\":2}}\n\n"), big: true, want: body(Result{Cost: 2})},
		{name: "event data at the cap still counts", spec: openAISpec, ctype: ctSSE, big: true,
			body: []byte("data: " + padTo(`{"usage":{"total_tokens":2},"p":"`, `"}`, MaxEventBytes) + "\n\n"), want: body(Result{Cost: 2})},
		{name: "event data one byte over the cap does not", spec: openAISpec, ctype: ctSSE, big: true,
			body: []byte("data: " + padTo(`{"usage":{"total_tokens":2},"p":"`, `"}`, MaxEventBytes+1) + "\n\n"), want: def(IssueOverCap)},
	}
}

// padTo returns head + x... + tail, n bytes long.
func padTo(head, tail string, n int) string {
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// stepReader returns its data in reads of the sizes next gives, then err
// (io.EOF if nil).
type stepReader struct {
	data []byte
	next func() int
	err  error
}

func (r *stepReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := min(r.next(), len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// meter runs c's body through a Meter read in the steps next gives, as a
// proxy copying it would, and returns what came out and the Result.
func (c *meterCase) meter(t testing.TB, next func() int) ([]byte, Result) {
	t.Helper()
	rule, err := Compile(c.spec)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	for k, v := range c.header {
		h[k] = v
	}
	if c.ctype != "" {
		h.Set("Content-Type", c.ctype)
	}
	var body io.ReadCloser
	if !c.nilBody {
		body = io.NopCloser(&stepReader{data: c.body, next: next, err: c.err})
	}
	m := rule.NewMeter(h, body)
	out := make([]byte, 0, len(c.body))
	buf := make([]byte, 32<<10)
	for {
		p := buf
		if c.cut > 0 {
			if len(out) == c.cut {
				break // the client went away
			}
			p = buf[:min(len(buf), c.cut-len(out))]
		}
		n, err := m.Read(p)
		out = append(out, p[:n]...)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, c.err) {
				t.Fatalf("Read: %v", err)
			}
			break
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return out, m.Cost(c.trailer)
}

func (c *meterCase) wantOut() []byte {
	if c.cut > 0 {
		return c.body[:c.cut]
	}
	return c.body
}

func whole() int { return 1 << 30 }

func TestMeter(t *testing.T) {
	for _, c := range meterCases(t) {
		t.Run(c.name, func(t *testing.T) {
			out, got := c.meter(t, whole)
			if !bytes.Equal(out, c.wantOut()) {
				t.Fatalf("passthrough differs: %d bytes out, want %d", len(out), len(c.wantOut()))
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Cost (-want +got):\n%s\nissues got %q want %q", diff, got.Issues, c.want.Issues)
			}
		})
	}
}

// TestMeterSplits feeds every body split at every byte boundary, and in
// 1-byte reads: the bytes out and the Result are those of one read.
func TestMeterSplits(t *testing.T) {
	for _, c := range meterCases(t) {
		t.Run(c.name, func(t *testing.T) {
			check := func(how string, next func() int) {
				t.Helper()
				out, got := c.meter(t, next)
				if !bytes.Equal(out, c.wantOut()) {
					t.Fatalf("%s: passthrough differs", how)
				}
				if diff := cmp.Diff(c.want, got); diff != "" {
					t.Fatalf("%s: Cost (-want +got):\n%s", how, diff)
				}
			}
			if c.big {
				// Sizes prime to every structure in the inputs.
				for _, size := range []int{7, 4093, 65521} {
					check(fmt.Sprintf("reads of %d", size), func() int { return size })
				}
				return
			}
			check("1-byte reads", func() int { return 1 })
			for k := 1; k < len(c.body); k++ {
				first := true
				check("split", func() int {
					if first {
						first = false
						return k
					}
					return 1 << 30
				})
			}
		})
	}
}

// TestMeterPassesEachWriteAtOnce: a Read returns what the upstream has
// sent without waiting for more, and the usage in it counts before the
// stream ends.
func TestMeterPassesEachWriteAtOnce(t *testing.T) {
	rule, err := Compile(anthropicSpec)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	m := rule.NewMeter(http.Header{"Content-Type": {ctSSE}}, pr)
	events := bytes.SplitAfter(fixture(t, "anthropic_stream.sse"), []byte("\n\n"))
	events = events[:len(events)-1] // the empty rest after the last event
	go func() {
		for _, e := range events {
			if _, err := pw.Write(e); err != nil {
				return
			}
		}
		pw.Close()
	}()
	buf := make([]byte, 32<<10)
	for i, e := range events {
		n, err := m.Read(buf)
		if err != nil || !bytes.Equal(buf[:n], e) {
			t.Fatalf("read %d: %q, %v; want %q", i, buf[:n], err, e)
		}
		if i == 0 {
			if got := m.Cost(nil); got.Cost != 25+1 || got.Source != SourceBody {
				t.Fatalf("after message_start: %+v, want 26 from the body", got)
			}
		}
	}
	if _, err := m.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
	if got := m.Cost(nil); got != (Result{Cost: 40, Source: SourceBody}) {
		t.Fatalf("at the end: %+v", got)
	}
}

func TestCompile(t *testing.T) {
	for _, c := range []struct {
		name string
		spec Spec
		err  string // "" for valid
	}{
		{name: "openai", spec: openAISpec},
		{name: "anthropic", spec: anthropicSpec},
		{name: "header only", spec: Spec{Header: "x-usage-tokens"}},
		{name: "nothing: Default only", spec: Spec{Default: 1}},
		{name: "negative default", spec: Spec{Default: -1}, err: "default -1 is outside"},
		{name: "default over MaxCost", spec: Spec{Default: MaxCost + 1}, err: "outside"},
		{name: "bad header", spec: Spec{Header: "x cost"}, err: `header "x cost" is not a valid HTTP header name`},
		{name: "empty field", spec: Spec{JSONFields: []string{""}}, err: "jsonFields[0] is empty"},
		{name: "empty segment", spec: Spec{JSONFields: []string{"usage..x"}}, err: "empty segment"},
		{name: "leading dot", spec: Spec{JSONFields: []string{".x"}}, err: "empty segment"},
		{name: "empty alternative", spec: Spec{JSONFields: []string{"a|"}}, err: "empty path"},
		{name: "space", spec: Spec{JSONFields: []string{"a b"}}, err: "only printable ASCII"},
		{name: "non-ASCII", spec: Spec{JSONFields: []string{"usäge"}}, err: "only printable ASCII"},
		{name: "too many fields", spec: Spec{JSONFields: strings.Split("a b c d e f g h i", " ")}, err: "9 jsonFields, at most 8"},
		{name: "too many paths", spec: Spec{JSONFields: []string{"a|b|c|d|e|f|g|h|i", "j|k|l|m|n|o|p|q"}}, err: "more than 16 paths"},
		{name: "too many segments", spec: Spec{JSONFields: []string{strings.Repeat("a.", 16) + "a"}}, err: "17 segments, at most 16"},
		{name: "too long", spec: Spec{JSONFields: []string{strings.Repeat("a", MaxFieldBytes+1)}}, err: "longer than 256 bytes"},
		{name: "repeated path", spec: Spec{JSONFields: []string{"a", "b|a"}}, err: `path "a" is already in jsonFields[0]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compile(c.spec)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one containing %q", err, c.err)
			}
		})
	}
}

func TestIssueString(t *testing.T) {
	if got := (IssueCut | IssueOverCap | IssueIgnoredValue).String(); got != "cut,over-cap,ignored-value" {
		t.Fatal(got)
	}
	if got := Issue(0).String(); got != "" {
		t.Fatal(got)
	}
}

// loopReader serves head, then data over and over: a body that never ends.
type loopReader struct {
	head, data []byte
	off        int
}

func (r *loopReader) Read(p []byte) (int, error) {
	if len(r.head) > 0 {
		n := copy(p, r.head)
		r.head = r.head[n:]
		return n, nil
	}
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

// TestMeterReadAllocatesNothing: after NewMeter, reading a stream or a
// JSON body allocates nothing, however long it runs.
func TestMeterReadAllocatesNothing(t *testing.T) {
	for _, c := range []struct {
		spec       Spec
		ct         string
		head, body []byte
	}{
		{anthropicSpec, ctSSE, nil, fixture(t, "anthropic_stream_crlf.sse")},
		{openAISpec, ctSSE, nil, fixture(t, "openai_stream.sse")},
		{openAISpec, ctJSON, []byte(`{"usage":{"total_tokens":3},"x":[`), []byte(`{"a":"b\"c","n":-1.5e3,"t":true},`)},
	} {
		rule, err := Compile(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		m := rule.NewMeter(http.Header{"Content-Type": {c.ct}}, io.NopCloser(&loopReader{head: c.head, data: c.body}))
		buf := make([]byte, 97) // reads that split events and tokens
		if allocs := testing.AllocsPerRun(1000, func() {
			if _, err := m.Read(buf); err != nil {
				t.Fatal(err)
			}
		}); allocs != 0 {
			t.Errorf("%s: %v allocations per Read", c.ct, allocs)
		}
		if got := m.Cost(nil); got.Source != SourceBody || got.Issues != IssueCut {
			t.Errorf("%s: %+v: want usage from the body, still parsing", c.ct, got)
		}
		if m.mode == modeJSON && (!m.json.parsing() || m.json.state == jsDone) {
			t.Errorf("the JSON scanner stopped (state %d): the loop measured nothing", m.json.state)
		}
	}
}
