package kubectlplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/topk"
)

// TopResult is the policy's most limited clients over every sidecar that
// answered.
type TopResult struct {
	Namespace string `json:"namespace"`
	Policy    string `json:"policy"`
	// Pods are the sidecars merged; Failed the ones that did not answer.
	Pods   []string          `json:"pods"`
	Failed map[string]string `json:"failed,omitempty"`
	// Since is the earliest start of the sidecars' counting.
	Since time.Time `json:"since"`
	// HashKeyID names the key of the client keys' hashes (all merged
	// sidecars share it).
	HashKeyID string `json:"hashKeyID"`
	topk.Summary
}

// Top asks every ready sidecar of the policy's pods for its 429s by client
// key and merges them (topk.Merge keeps each count's bounds). The keys are
// keyed hashes (package clienthash); a sidecar hashing with another key
// than the first one's is reported, not merged.
func (c *Client) Top(ctx context.Context, ns, policy string, k int) (*TopResult, error) {
	p, err := c.Policy(ctx, ns, policy)
	if err != nil {
		return nil, err
	}
	targets, err := c.Targets(ctx, p)
	if err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("no ready pod with the slidegate sidecar is selected by policy %s/%s", ns, policy)
	}
	res := &TopResult{Namespace: ns, Policy: policy}
	var sums []topk.Summary
	for _, t := range targets {
		body, err := c.Get(ctx, t, debugapi.TopPath, map[string]string{"policy": policy}, nil)
		var tr debugapi.TopResponse
		if err == nil {
			err = json.Unmarshal(body, &tr)
		}
		if err == nil && res.HashKeyID != "" && tr.HashKeyID != res.HashKeyID {
			// The same client has another hash there: merging would split
			// its count.
			err = fmt.Errorf("its client keys are hashed with another key (%s, not %s): a sidecar started before "+
				"its namespace's key was mirrored; restart the pod", tr.HashKeyID, res.HashKeyID)
		}
		if err != nil {
			var refusal *RefusedError
			if errors.As(err, &refusal) {
				return nil, err // the same for every pod
			}
			if res.Failed == nil {
				res.Failed = map[string]string{}
			}
			res.Failed[t.Pod] = err.Error()
			continue
		}
		res.Pods = append(res.Pods, t.Pod)
		res.HashKeyID = tr.HashKeyID
		sums = append(sums, tr.Summary)
		if res.Since.IsZero() || tr.Since.Before(res.Since) {
			res.Since = tr.Since
		}
	}
	if len(sums) == 0 {
		return nil, fmt.Errorf("no sidecar of policy %s/%s answered: %v", ns, policy, res.Failed)
	}
	res.Summary = topk.Merge(k, sums...)
	return res, nil
}

// PrintTop writes res as a table (format "") or JSON ("json").
func PrintTop(w io.Writer, res *TopResult, format string) error {
	if done, err := printJSON(w, res, format); done {
		return err
	}
	rows := [][]string{{"RANK", "KEY", "429s", "AT-LEAST"}}
	for i, it := range res.Items {
		rows = append(rows, []string{strconv.Itoa(i + 1), it.Key, strconv.FormatUint(it.Count, 10), strconv.FormatUint(it.Count-it.Err, 10)})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d 429s of policy %s on %d pods since %s; any client not listed had at most %d\n",
		res.Total, res.Policy, len(res.Pods), res.Since.UTC().Format(time.RFC3339), res.Min)
	for pod, msg := range res.Failed {
		if err == nil {
			_, err = fmt.Fprintf(w, "pod %s did not answer: %s\n", pod, msg)
		}
	}
	return err
}
