package kubectlplugin

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/slidegate/slidegate/internal/debugapi"
)

// QuotaResult is what `kubectl slidegate quota` prints with -o json|yaml:
// the client's quotas under one policy, as a sidecar read them.
type QuotaResult struct {
	Pod       string              `json:"pod"`
	Policy    string              `json:"policy"`
	ClientKey string              `json:"clientKey,omitempty"`
	Quotas    []debugapi.WhyLimit `json:"quotas"`
}

// Quotas picks the quotas of the policy res was asked about; an error
// when it has none.
func Quotas(res *WhyResult) (*QuotaResult, error) {
	p := res.Policies[0]
	out := &QuotaResult{Pod: res.Pod, Policy: p.Name, ClientKey: p.ClientKey}
	for _, l := range p.AdditionalLimits {
		if l.Quota != nil || l.Error != "" && isQuotaName(p.Name, l.Name) {
			out.Quotas = append(out.Quotas, l)
		}
	}
	if len(out.Quotas) == 0 {
		if p.Unknown != "" {
			return nil, fmt.Errorf("policy %s %s", p.Name, p.Unknown)
		}
		return nil, fmt.Errorf("policy %s has no quotas (spec.quotas)", p.Name)
	}
	return out, nil
}

// isQuotaName says whether a row's name is one of a quota ("api/day"),
// for a row whose read failed (it then has no Quota).
func isQuotaName(policy, name string) bool {
	return name == policy+"/day" || name == policy+"/month"
}

// PrintQuota writes q as a table (format "") or JSON/YAML: per quota the
// admits of the current period, the limit, what remains, the period in its
// time zone, and when it resets.
func PrintQuota(w io.Writer, q *QuotaResult, format string) error {
	if done, err := printJSON(w, q, format); done {
		return err
	}
	rows := [][]string{{"QUOTA", "KEY", "USED", "LIMIT", "REMAINING", "PERIOD", "RESETS-AT", "RESETS-IN"}}
	for _, l := range q.Quotas {
		row := []string{l.Name, orDash(q.ClientKey), "-", strconv.FormatInt(l.Limit, 10), "-", "-", "-", "-"}
		if l.Error != "" {
			row[2] = "error: " + l.Error
		}
		if win, qu := l.Window, l.Quota; win != nil && qu != nil {
			row[2] = strconv.FormatFloat(win.InWindow, 'f', -1, 64)
			row[4] = strconv.FormatInt(win.Remaining, 10)
			row[5] = periodName(qu)
			row[6] = qu.End.Format(time.RFC3339)
			row[7] = until(qu.End.Sub(win.ServerTime))
		}
		rows = append(rows, row)
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nasked pod %s\n", q.Pod)
	return err
}

// until is a wait of hours or days as people read it: "4h12m3s",
// "24d4h12m".
func until(d time.Duration) string {
	d = d.Round(time.Second)
	if d < 24*time.Hour {
		return d.String()
	}
	days := d / (24 * time.Hour)
	d -= days * 24 * time.Hour
	return fmt.Sprintf("%dd%dh%dm", days, d/time.Hour, (d%time.Hour)/time.Minute)
}

// periodName is a quota's period as its zone's calendar names it:
// "2026-12-07 America/New_York" for a day, "2026-12 UTC" for a month.
func periodName(q *debugapi.WhyQuota) string {
	layout := time.DateOnly
	if q.Period == "Month" {
		layout = "2006-01"
	}
	start := q.Start
	if loc, err := time.LoadLocation(q.TimeZone); err == nil {
		start = start.In(loc)
	}
	return start.Format(layout) + " " + q.TimeZone
}
