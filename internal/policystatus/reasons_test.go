/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package policystatus

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
)

// TestReasonsDocumented: every reason a condition takes here is among the
// reasons the condition's documentation in api/v1alpha1 lists, so a user
// (and the docs built from it) knows every reason a condition can carry.
// The inputs take each path of Desired and DesiredService.
func TestReasonsDocumented(t *testing.T) {
	documented := conditionDocs(t)
	p := newPolicy("shop", "web")
	legacyJWT := newPolicy("shop", "jwt", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Key = v1alpha1.ClientKey{Source: v1alpha1.KeySourceJWTClaim, Name: "sub"}
	})
	hourAgo := time.Now().Add(-time.Hour)
	stalled := p.DeepCopy()
	stalled.Status.Conditions = []metav1.Condition{{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse,
		Reason: string(v1alpha1.ReasonRedisCredentialsUnavailable), LastTransitionTime: metav1.NewTime(hourAgo)}}
	budget := stalled.DeepCopy()
	budget.Status.Conditions[0].Reason = string(v1alpha1.ReasonRedisMemoryBudgetExceeded)
	ok := Input{Revision: "r", Matched: 2, Enforced: 2, Now: time.Now(), Grace: time.Minute}
	with := func(mutate func(*Input)) Input {
		in := ok
		mutate(&in)
		return in
	}
	var statuses []v1alpha1.RateLimitPolicyStatus
	for _, c := range []struct {
		p  *v1alpha1.RateLimitPolicy
		in Input
	}{
		{p, ok},
		{legacyJWT, ok},
		{p, with(func(in *Input) { in.NotAccepted = NotAccepted(&render.InvalidPolicyError{Err: errors.New("bad")}) })},
		{p, with(func(in *Input) { in.NotAccepted = NotAccepted(&render.ConfigTooLargeError{}) })},
		{p, with(func(in *Input) { in.NotAccepted = NotAccepted(&render.FootprintTooLargeError{}) })},
		{p, with(func(in *Input) { in.NotAccepted = NotAccepted(&render.DomainNotAllowedError{}) })},
		{p, with(func(in *Input) { in.HeldBack = HeldBack(2, []string{"old"}, "shop") })},
		{stalled, with(func(in *Input) { in.Credentials = Credentials("no Secret") })},
		{budget, with(func(in *Input) { in.Credentials = New(v1alpha1.ReasonRedisMemoryBudgetExceeded, "over") })},
		{p, with(func(in *Input) { in.Keys = Keys("none", p) })},
		{p, with(func(in *Input) { in.Matched, in.Enforced = 0, 0 })},
		{p, with(func(in *Input) { in.Skipped = Skipped(2, []string{"old"}, "shop") })},
		{p, with(func(in *Input) { in.Bypass = "Service web port 80" })},
		{p, with(func(in *Input) { in.Reopened = "NetworkPolicy open" })},
		{p, with(func(in *Input) { in.Enforced = 1 })},
	} {
		statuses = append(statuses, Desired(c.p, c.in))
	}
	rls := newRLSPolicy("edge", "login")
	server := Server{Addr: "10.0.0.1:8082", Loaded: map[string]bool{"r": true}}
	for _, in := range []ServiceInput{
		{Revision: "r", Servers: []Server{server}},
		{Revision: "r"},
		{Revision: "r2", Servers: []Server{server}},
		{NotAccepted: NotAccepted(&render.DomainNotAllowedError{})},
	} {
		statuses = append(statuses, DesiredService(rls, in))
	}
	seen := map[v1alpha1.ConditionType]map[string]bool{}
	for _, st := range statuses {
		for _, c := range st.Conditions {
			typ := v1alpha1.ConditionType(c.Type)
			if seen[typ] == nil {
				seen[typ] = map[string]bool{}
			}
			seen[typ][c.Reason] = true
		}
	}
	for typ, reasons := range seen {
		for reason := range reasons {
			if !slices.Contains(documented[typ], reason) {
				t.Errorf("condition %s takes reason %s, which its documentation in api/v1alpha1/wellknown.go does not list (%v)", typ, reason, documented[typ])
			}
		}
	}
	if len(seen) != 4 {
		t.Errorf("conditions taken: %v; want Ready, Accepted, Enforced and Stalled", seen)
	}
}

// conditionDocs reads the reasons each Condition* constant's comment in
// api/v1alpha1/wellknown.go lists after "Reasons:".
func conditionDocs(t *testing.T) map[v1alpha1.ConditionType][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../api/v1alpha1/wellknown.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	word := regexp.MustCompile(`[A-Z][A-Za-z]+`)
	out := map[v1alpha1.ConditionType][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Doc == nil || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "Condition") || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.BasicLit)
		if !ok {
			return true
		}
		_, reasons, found := strings.Cut(vs.Doc.Text(), "Reasons:")
		if !found {
			t.Errorf("%s: its comment lists no \"Reasons:\"", vs.Names[0].Name)
		}
		out[v1alpha1.ConditionType(strings.Trim(lit.Value, `"`))] = word.FindAllString(reasons, -1)
		return true
	})
	return out
}
