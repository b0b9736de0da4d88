package respcost

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// loop runs body b.N times on one locked OS thread and reports, besides
// ns/op, the thread's CPU time per op (cpu-ns/op), which on a machine
// shared with other work is the figure to compare.
func loop(b *testing.B, size int, body func()) {
	b.SetBytes(int64(size))
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, ok := threadCPU()
	for b.Loop() {
		body()
	}
	if end, ok2 := threadCPU(); ok && ok2 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}

// chatBody is an OpenAI chat completion of about n bytes: a long answer
// (with the escapes real text has) and usage at the end.
func chatBody(n int) []byte {
	var content strings.Builder
	for content.Len() < n-600 {
		content.WriteString(`The boardwalk runs through a \"lush\" green meadow;\nthe sky is blue. `)
	}
	return []byte(`{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + content.String() + `","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0}},` +
		`"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}`)
}

// embeddingsBody is an OpenAI embeddings response of about n bytes: the
// parser's worst realistic case, all numbers.
func embeddingsBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`)
	for i := 0; b.Len() < n-200; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%.9f", float64(i%1000)/1000-0.5)
	}
	b.WriteString(`]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`)
	return []byte(b.String())
}

// sseEvents is an OpenAI stream of n content chunks, a usage chunk and
// [DONE]: one event per write, as a model server flushes them.
func sseEvents(n int) [][]byte {
	var evs [][]byte
	for i := range n {
		evs = append(evs, fmt.Appendf(nil, `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" token%d"},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", i))
	}
	evs = append(evs,
		[]byte(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1000,"total_tokens":1009}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return evs
}

// chunkReader returns one chunk per Read; it has no WriteTo, so io.Copy
// goes through its buffer as a proxy does.
type chunkReader struct {
	chunks [][]byte
	cur    []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if len(r.chunks) == 0 {
			return 0, io.EOF
		}
		r.cur, r.chunks = r.chunks[0], r.chunks[1:]
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// benchCopy compares copying the body through a Meter with a bare copy,
// both with a 32 KiB buffer (httputil.ReverseProxy's) into a writer that
// discards.
func benchCopy(b *testing.B, spec Spec, ct string, chunks [][]byte, want int64) {
	rule, err := Compile(spec)
	if err != nil {
		b.Fatal(err)
	}
	size := 0
	for _, c := range chunks {
		size += len(c)
	}
	h := http.Header{"Content-Type": {ct}}
	buf := make([]byte, 32<<10)
	var dst io.Writer = struct{ io.Writer }{io.Discard} // no ReadFrom: copy through buf
	b.Run("copy", func(b *testing.B) {
		r := &chunkReader{}
		loop(b, size, func() {
			r.chunks, r.cur = chunks, nil
			if _, err := io.CopyBuffer(dst, r, buf); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("meter", func(b *testing.B) {
		r := &chunkReader{}
		loop(b, size, func() {
			r.chunks, r.cur = chunks, nil
			m := rule.NewMeter(h, io.NopCloser(r))
			if _, err := io.CopyBuffer(dst, m, buf); err != nil {
				b.Fatal(err)
			}
			if got := m.Cost(nil); got.Cost != want {
				b.Fatalf("cost %+v, want %d", got, want)
			}
		})
	})
}

func BenchmarkJSON64K(b *testing.B) {
	body := chatBody(64 << 10)
	benchCopy(b, openAISpec, ctJSON, [][]byte{body}, 1163)
}

func BenchmarkJSON64KNumbers(b *testing.B) {
	body := embeddingsBody(64 << 10)
	benchCopy(b, openAISpec, ctJSON, [][]byte{body}, 8)
}

func BenchmarkSSE1000(b *testing.B) {
	benchCopy(b, openAISpec, ctSSE, sseEvents(1000), 1009)
}

// BenchmarkSSE1000Read is the same stream in 32 KiB reads (a reader that
// fell behind the upstream): the parser's cost without the per-event Read.
func BenchmarkSSE1000Read(b *testing.B) {
	benchCopy(b, openAISpec, ctSSE, [][]byte{bytes.Join(sseEvents(1000), nil)}, 1009)
}
