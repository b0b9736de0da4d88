package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/kubectlplugin"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The token-limited step (issue 27): config/samples' token sample, applied
// on its own as its comment says (the demo app is no model server), in
// front of a model server that streams its answer as Server-Sent Events
// and reports the tokens in the last event, as OpenAI-compatible servers do.
const (
	TokenSample = "ratelimit_v1alpha1_ratelimitpolicy_tokens.yaml"
	TokenPolicy = "tokens-per-key"
	// TokenKey is the API key of every stream, in the policy's key header.
	TokenKey = "team-a"
	// TokensPerStream is what each stream's usage event reports: the
	// sample's 100,000 a minute admit three streams (at 0, 40,000 and
	// 80,000 tokens, each under the limit) and the third puts the key
	// 20,000 in debt.
	TokensPerStream = 40000
	// TokenRequests is how many streams the key asks for.
	TokenRequests = 5
)

// TokenResult is what the token-limited step showed.
type TokenResult struct {
	Limit  int64
	Window time.Duration
	// Statuses are the answers' status codes, in order.
	Statuses []int
	Admitted int
	Rejected int
	// Remaining is the RateLimit field's r= of each admitted stream: the
	// tokens left in the window when it was admitted.
	Remaining []int64
	// Tokens is the sum of total_tokens in the usage events the client
	// read; Whole counts the streams that reached it up to [DONE].
	Tokens, Whole int
	UpstreamSeen  int64
	Sample429     *http.Response
	Sample429Body string
	// Since429 is the time from the first request to the first 429: the
	// first charge left the window at most that much after it began, so
	// the 429's Retry-After is within [window - Since429, window].
	Since429 time.Duration
	Why      *kubectlplugin.WhyResult
	SinceWhy time.Duration
}

// modelServer answers every request like an OpenAI-compatible server asked
// to stream a chat completion (with stream_options.include_usage): a few
// content events, each flushed on its own, then the usage event and
// [DONE]. In process, on loopback, like the demo's app: the step needs a
// stream, which the demo app (agnhost netexec) does not send.
//
// What went wrong on its side (a failed read of the request or write of the
// stream, with when) goes to errs, for a failure's message.
func modelServer(tokens int, seen *atomic.Int64, errs *modelErrors) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := seen.Add(1)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			errs.add("request %d: reading the body: %v", n, err)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl, _ := w.(http.Flusher)
		write := func(ev string) {
			if _, err := io.WriteString(w, ev); err != nil {
				errs.add("request %d: writing %q: %v", n, ev, err)
			}
		}
		for i, word := range []string{"Sliding", " windows", " are", " exact."} {
			write(fmt.Sprintf("data: {\"id\":\"chatcmpl-demo\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word))
			if fl != nil && i < 3 {
				fl.Flush()
			}
		}
		prompt := tokens / 4
		write(fmt.Sprintf("data: {\"id\":\"chatcmpl-demo\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", prompt, tokens-prompt, tokens))
		write("data: [DONE]\n\n")
		if err := r.Context().Err(); err != nil {
			errs.add("request %d: its context ended: %v", n, context.Cause(r.Context()))
		}
	}))
}

// modelErrors are what modelServer saw fail, with when.
type modelErrors struct {
	mu   sync.Mutex
	list []string
}

func (e *modelErrors) add(format string, a ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, time.Now().Format("15:04:05.000000 ")+fmt.Sprintf(format, a...))
}

func (e *modelErrors) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.list) == 0 {
		return "none"
	}
	return strings.Join(e.list, "; ")
}

// runTokens is the token-limited step: it applies the token sample through
// the API server (CEL validation and the controller's render run), creates
// a pod it selects (the webhook injects the sidecar), runs that sidecar in
// front of modelServer, streams as one API key until refused, and asks the
// sidecar why.
func runTokens(ctx context.Context, c *Cluster, o Options, logf func(string, ...any)) (*TokenResult, error) {
	policy, labels, err := applyTokenSample(ctx, c, o.Out, logf)
	if err != nil {
		return nil, err
	}
	header := policy.Spec.Key.Name

	var sel []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		sel = append(sel, k+"="+labels[k])
	}
	logf("creating a pod labelled %s (the demo app's pod spec under the labels %s selects); the webhook injects the sidecar", strings.Join(sel, ","), TokenPolicy)
	pod, err := createPodFromDeployment(ctx, c.Client, labels)
	if err != nil {
		return nil, err
	}
	if err := waitRendered(ctx, c.Client); err != nil {
		return nil, err
	}
	var seen atomic.Int64
	var upstreamErrs modelErrors
	upstream := modelServer(TokensPerStream, &seen, &upstreamErrs)
	defer upstream.Close()
	// At debug level the sidecar logs what its reverse proxy saw go wrong
	// (a read error mid-stream), which a failure below quotes.
	sc, err := c.StartSidecar(ctx, o.SidecarBin, pod, upstream.URL, logf, "--log-level=debug")
	if err != nil {
		return nil, err
	}
	c.KeepSynced(sc, Namespace)

	window, err := time.ParseDuration(string(policy.Spec.Window))
	if err != nil {
		return nil, err
	}
	res := &TokenResult{Limit: int64(policy.Spec.Limit), Window: window}
	logf("token traffic: %d streams with %s: %s; the model server reports %d tokens in each stream's last event; %s allows %d tokens per %s",
		TokenRequests, header, TokenKey, TokensPerStream, TokenPolicy, res.Limit, policy.Spec.Window)
	start := time.Now()
	if err := res.streamAll(ctx, o.Out, sc.URL, header, start); err != nil {
		return nil, fmt.Errorf("%w\n(at %s; the model server saw %d requests, its errors: %s)\nthe sidecar's log, last lines:\n%s",
			err, time.Now().Format("15:04:05.000000"), seen.Load(), &upstreamErrs, sc.LogTail(40))
	}
	res.UpstreamSeen = seen.Load()
	fmt.Fprintf(o.Out, "    %d streams admitted, %d tokens served (the limit is %d: %d in debt), %d refused; the model server saw %d requests\n",
		res.Admitted, res.Tokens, res.Limit, max(0, int64(res.Tokens)-res.Limit), res.Rejected, res.UpstreamSeen)
	if res.Sample429 != nil {
		fmt.Fprintf(o.Out, "    the first 429, %s after the first stream began:\n", res.Since429.Round(time.Millisecond))
		dump, _ := httputil.DumpResponse(res.Sample429, false)
		fmt.Fprint(o.Out, indent(string(dump)+res.Sample429Body))
	}

	logf("kubectl slidegate why %s -n %s --header %s (the plugin's request, sent to the sidecar's debug port directly: no kubelet here to port-forward)",
		TokenPolicy, Namespace, TokenKey)
	if res.Why, err = why(ctx, sc.DebugURL, pod.Name, TokenPolicy, sidecarconfig.SourceHeader, TokenKey); err != nil {
		return nil, err
	}
	res.SinceWhy = time.Since(start)
	var b strings.Builder
	if err := kubectlplugin.PrintWhy(&b, res.Why, ""); err != nil {
		return nil, err
	}
	fmt.Fprint(o.Out, indent(b.String()))
	return res, nil
}

// applyTokenSample applies the token sample as a user would and returns
// the policy the API server holds and the labels it selects pods by.
func applyTokenSample(ctx context.Context, c *Cluster, w io.Writer, logf func(string, ...any)) (*v1alpha1.RateLimitPolicy, map[string]string, error) {
	root, err := testsupport.RepoRoot()
	if err != nil {
		return nil, nil, err
	}
	logf("kubectl apply --server-side -n %s -f config/samples/%s", Namespace, TokenSample)
	out, err := c.Kubectl(ctx, "apply", "--server-side", "-n", Namespace, "-f", filepath.Join(root, "config", "samples", TokenSample))
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprint(w, indent(out))
	var policy v1alpha1.RateLimitPolicy
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: TokenPolicy}, &policy); err != nil {
		return nil, nil, err
	}
	if policy.Spec.TargetSelector == nil || policy.Spec.Key.Source != sidecarconfig.SourceHeader {
		return nil, nil, fmt.Errorf("%s selects no pods by label or keys on no header: the step needs both", TokenSample)
	}
	labels := map[string]string{}
	for k, v := range policy.Spec.TargetSelector.MatchLabels {
		labels[k] = string(v)
	}
	return &policy, labels, nil
}

// streamAll sends the TokenRequests streams in turn, reads each to its
// end, records the answers in t (Since429 from start) and prints one line
// per stream to w.
func (t *TokenResult) streamAll(ctx context.Context, w io.Writer, url, header string, start time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    STREAM\tSTATUS\tRATELIMIT\tRETRY-AFTER\tTOKENS READ")
	for i := range TokenRequests {
		s, err := stream(ctx, url, header)
		if err != nil {
			return fmt.Errorf("stream %d: %w", i+1, err)
		}
		t.Statuses = append(t.Statuses, s.resp.StatusCode)
		switch s.resp.StatusCode {
		case http.StatusOK:
			t.Admitted++
			t.Tokens += s.tokens
			if s.done {
				t.Whole++
			}
			if m := remainingParam.FindStringSubmatch(s.resp.Header.Get("RateLimit")); m != nil {
				r, _ := strconv.ParseInt(m[1], 10, 64)
				t.Remaining = append(t.Remaining, r)
			} else {
				t.Remaining = append(t.Remaining, -1)
			}
		case http.StatusTooManyRequests:
			t.Rejected++
			if t.Sample429 == nil {
				t.Since429 = time.Since(start)
				t.Sample429, t.Sample429Body = s.resp, s.body
			}
		default:
			return fmt.Errorf("stream %d: unexpected %s: %s", i+1, s.resp.Status, s.body)
		}
		fmt.Fprintf(tw, "    %d\t%d\t%s\t%s\t%d\n", i+1, s.resp.StatusCode, s.resp.Header.Get("RateLimit"), s.resp.Header.Get("Retry-After"), s.tokens)
	}
	return tw.Flush()
}

var remainingParam = regexp.MustCompile(`;r=(\d+)`)

// streamed is one streaming request's answer as the client read it.
type streamed struct {
	resp *http.Response
	body string
	// tokens is the usage event's total_tokens; done is true when the
	// stream reached [DONE].
	tokens int
	done   bool
}

// stream asks for a streamed chat completion as API key TokenKey and reads
// the answer to its end.
func stream(ctx context.Context, url, header string) (*streamed, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Why sliding windows?"}]}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set(header, TokenKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	s := &streamed{resp: resp}
	if resp.StatusCode != http.StatusOK {
		body, err := io.ReadAll(resp.Body)
		s.body = string(body)
		return s, err
	}
	sc := bufio.NewScanner(resp.Body)
	events, began := 0, time.Now()
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events++
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var ev struct {
			Usage *struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return nil, fmt.Errorf("event %q: %w", data, err)
		}
		if ev.Usage != nil {
			s.tokens += ev.Usage.TotalTokens
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w after %d events in %s (headers %v)", err, events, time.Since(began).Round(time.Millisecond), resp.Header)
	}
	return s, nil
}

// why sends the request `kubectl slidegate why` sends through its
// port-forward (kubectlplugin.Client.Why) to a sidecar's debug address.
func why(ctx context.Context, debugURL, pod, policy, source, value string) (*kubectlplugin.WhyResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, debugURL+debugapi.WhyPath+"?policy="+policy+"&source="+source, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(debugapi.WhyValueHeader, value)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", debugapi.WhyPath, resp.Status, strings.TrimSpace(string(body)))
	}
	res := &kubectlplugin.WhyResult{Pod: pod}
	if err := json.Unmarshal(body, &res.WhyResponse); err != nil {
		return nil, fmt.Errorf("%s: %w", debugapi.WhyPath, err)
	}
	return res, nil
}

// checkTokens is Check for the token-limited step.
func checkTokens(t *TokenResult, bad func(string, ...any)) {
	if t == nil {
		bad("no token-limited step")
		return
	}
	// Admitted while the window's tokens are under the limit: at 0,
	// 40,000 and 80,000 of 100,000; the rest refused.
	wantAdmitted := int((t.Limit + TokensPerStream - 1) / TokensPerStream)
	if t.Admitted != wantAdmitted || t.Rejected != TokenRequests-wantAdmitted {
		bad("tokens: %d streams admitted and %d refused (%v); want %d and %d under %d tokens of %d each",
			t.Admitted, t.Rejected, t.Statuses, wantAdmitted, TokenRequests-wantAdmitted, t.Limit, TokensPerStream)
	}
	for i, r := range t.Remaining {
		if want := t.Limit - int64(i)*TokensPerStream; r != want {
			bad("tokens: stream %d admitted with RateLimit r=%d, want %d (the window's tokens so far)", i+1, r, want)
		}
	}
	if t.Whole != t.Admitted || t.Tokens != t.Admitted*TokensPerStream || t.UpstreamSeen != int64(t.Admitted) {
		bad("tokens: %d of %d admitted streams whole, %d tokens read, the model server saw %d", t.Whole, t.Admitted, t.Tokens, t.UpstreamSeen)
	}
	if t.Sample429 == nil {
		bad("tokens: no 429")
	} else {
		ra, err := strconv.Atoi(t.Sample429.Header.Get("Retry-After"))
		low := int((t.Window - t.Since429).Seconds())
		if err != nil || ra < low || ra > int(t.Window.Seconds()) {
			bad("tokens: Retry-After %q; want within [%d, %d] (the first charge leaves the window then)", t.Sample429.Header.Get("Retry-After"), low, int(t.Window.Seconds()))
		}
		if !strings.HasPrefix(t.Sample429.Header.Get("RateLimit"), `"`+TokenPolicy+`";`) {
			bad("tokens: the 429's RateLimit field does not name %s: %q", TokenPolicy, t.Sample429.Header.Get("RateLimit"))
		}
	}
	if t.Why == nil || len(t.Why.Policies) == 0 || !t.Why.Policies[0].Target || t.Why.Policies[0].Window == nil {
		bad("tokens: why answered no window for %s: %+v", TokenPolicy, t.Why)
		return
	}
	w := t.Why.Policies[0].Window
	// The window holds the charged tokens, past the limit: the debt.
	if w.Unit != "cost" || w.InWindow != float64(t.Tokens) || w.Allowed || w.Remaining != 0 {
		bad("tokens: why shows %v in the window (unit %q, allowed %v, remaining %d); want %d cost, not allowed, 0 remaining",
			w.InWindow, w.Unit, w.Allowed, w.Remaining, t.Tokens)
	}
	if low := (t.Window - t.SinceWhy).Seconds(); w.RetryAfterSeconds < low || w.RetryAfterSeconds > t.Window.Seconds() {
		bad("tokens: why's retry after %.3fs; want within [%.3f, %.0f]", w.RetryAfterSeconds, low, t.Window.Seconds())
	}
}
