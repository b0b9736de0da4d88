package respcost

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// fuzzSpec has short paths the fuzzer finds easily, alternatives, and the
// model servers' paths the seeds hold.
var fuzzSpec = Spec{
	JSONFields: []string{
		"usage.total_tokens",
		"usage.input_tokens|message.usage.input_tokens",
		"a.b|c",
		"x",
	},
	Default: 100,
}

// FuzzMeter: no panic on any body; the bytes pass through unchanged; the
// Result does not depend on how the body is split into reads; the cost is
// in range; and for a valid JSON body the cost is what a reference walk
// with encoding/json's tokenizer finds.
func FuzzMeter(f *testing.F) {
	for _, name := range []string{"openai_chat.json", "openai_stream.sse", "anthropic_messages.json", "anthropic_stream.sse", "anthropic_stream_crlf.sse"} {
		b := fixture(f, name)
		f.Add(b, strings.HasSuffix(name, ".sse"), uint16(7))
	}
	for _, s := range []string{
		`{"a":{"b":3},"c":4,"x":5}`,
		`{"x":-1,"c":1.5,"a":{"b":"2"}}`,
		`{"\u0078":7}`,
		`{"x":[{"x":1}],"x":99999999999}`,
		"data: {\"x\":1}\r\n\r\ndata: [DONE]\n\n",
		"data: {\"x\":\ndata: 2}\n\n",
		": c\nevent: e\ndata\n\n",
	} {
		f.Add([]byte(s), strings.HasPrefix(s, "data") || strings.HasPrefix(s, ":"), uint16(1))
	}
	rule, err := Compile(fuzzSpec)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, sse bool, split uint16) {
		checkMeter(t, rule, body, sse, split)
	})
}

func checkMeter(t *testing.T, rule *Rule, body []byte, sse bool, split uint16) {
	t.Helper()
	{
		ct := ctJSON
		if sse {
			ct = ctSSE
		}
		run := func(next func() int) ([]byte, Result) {
			m := rule.NewMeter(http.Header{"Content-Type": {ct}}, io.NopCloser(&stepReader{data: body, next: next}))
			var out bytes.Buffer
			if _, err := io.Copy(&out, m); err != nil {
				t.Fatal(err)
			}
			return out.Bytes(), m.Cost(nil)
		}
		out, want := run(whole)
		if !bytes.Equal(out, body) {
			t.Fatal("passthrough differs")
		}
		if want.Cost < 0 || want.Cost > MaxCost {
			t.Fatalf("cost %d out of range", want.Cost)
		}
		k := int(split)%(len(body)+1) + 1
		first := true
		for _, next := range []func() int{
			func() int { return 1 },
			func() int {
				if first {
					first = false
					return k
				}
				return 1 << 30
			},
			func() int { return k },
		} {
			out, got := run(next)
			if !bytes.Equal(out, body) {
				t.Fatal("passthrough differs when split")
			}
			if got != want {
				t.Fatalf("split %d: %+v, whole: %+v", k, got, want)
			}
		}
		if !sse && json.Valid(body) && want.Issues&IssueOverCap == 0 {
			if ref := referenceCost(t, rule, body); ref != want.Cost {
				t.Fatalf("cost %d, encoding/json walk finds %d (%+v)", want.Cost, ref, want)
			}
		}
	}
}

// referenceCost walks a valid JSON document with encoding/json's tokenizer
// (keys decoded, so escapes and duplicates are its to judge) and sums the
// last whole number seen at each field's paths.
func referenceCost(t *testing.T, r *Rule, body []byte) int64 {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		obj     bool
		path    []string // nil: no field can lie below (an array on the way)
		wantKey bool
		key     string
	}
	var stack []frame
	var vals [MaxFields]int64
	var found uint8
	// valuePath is the path of the value about to be read.
	valuePath := func() []string {
		if len(stack) == 0 {
			return []string{}
		}
		top := stack[len(stack)-1]
		if !top.obj || top.path == nil {
			return nil
		}
		return append(append([]string(nil), top.path...), top.key)
	}
	afterValue := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reference walk of valid JSON: %v", err)
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				afterValue()
				continue
			}
			stack[n-1].key, stack[n-1].wantKey = tok.(string), false
			continue
		}
		if len(stack) == 0 {
			if d, ok := tok.(json.Delim); !ok || d != '{' {
				return r.def // only an object holds fields
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				var p []string
				if v == '{' {
					p = valuePath()
				}
				stack = append(stack, frame{obj: v == '{', path: p, wantKey: v == '{'})
			case ']':
				stack = stack[:len(stack)-1]
				afterValue()
			}
		case json.Number:
			p := strings.Join(valuePath(), "\x00")
			for _, rp := range r.paths {
				if valuePath() != nil && p == strings.Join(rp.segs, "\x00") {
					s := v.String()
					if len(s) > MaxNumberBytes || strings.Trim(s, "0123456789") != "" {
						continue
					}
					var n int64
					for i := 0; i < len(s); i++ {
						n = addDigit(n, s[i])
					}
					vals[rp.field] = min(n, MaxCost)
					found |= 1 << rp.field
				}
			}
			afterValue()
		default:
			afterValue()
		}
	}
	if found == 0 {
		return r.def
	}
	var sum int64
	for f := range MaxFields {
		if found&(1<<f) != 0 {
			sum += vals[f]
		}
	}
	return min(sum, MaxCost)
}
