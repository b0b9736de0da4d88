package sidecar

import (
	"maps"
	"testing"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

func TestParseLabels(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr bool
	}{
		{name: "empty file", in: "", want: map[string]string{}},
		{name: "downward API format", in: "app=\"shop\"\npod-template-hash=\"5d4b8c\"\n",
			want: map[string]string{"app": "shop", "pod-template-hash": "5d4b8c"}},
		{name: "escaped value and prefixed key", in: `example.com/team="a \"b\"\\c"` + "\n",
			want: map[string]string{"example.com/team": `a "b"\c`}},
		{name: "empty value", in: "tier=\"\"", want: map[string]string{"tier": ""}},
		{name: "blank lines and CRLF", in: "\r\na=\"1\"\r\n\r\n", want: map[string]string{"a": "1"}},
		{name: "value with equals sign", in: `a="x=y"`, want: map[string]string{"a": "x=y"}},
		{name: "unquoted value", in: "a=b", wantErr: true},
		{name: "no equals", in: "a", wantErr: true},
		{name: "no key", in: `="x"`, wantErr: true},
		{name: "unterminated quote", in: `a="b`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLabels([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSelectorMatches(t *testing.T) {
	labels := map[string]string{"app": "shop", "tier": "web"}
	req := func(key, op string, values ...string) sidecarconfig.Requirement {
		return sidecarconfig.Requirement{Key: key, Operator: op, Values: values}
	}
	tests := []struct {
		name string
		sel  sidecarconfig.Selector
		want bool
	}{
		{"empty selector matches every pod", sidecarconfig.Selector{}, true},
		{"matchLabels equal", sidecarconfig.Selector{MatchLabels: map[string]string{"app": "shop"}}, true},
		{"matchLabels all must hold", sidecarconfig.Selector{MatchLabels: map[string]string{"app": "shop", "tier": "db"}}, false},
		{"matchLabels missing key", sidecarconfig.Selector{MatchLabels: map[string]string{"team": ""}}, false},
		{"In", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("tier", "In", "db", "web")}}, true},
		{"In missing key", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("team", "In", "a")}}, false},
		{"NotIn", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("tier", "NotIn", "web")}}, false},
		{"NotIn missing key matches", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("team", "NotIn", "a")}}, true},
		{"Exists", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("app", "Exists")}}, true},
		{"DoesNotExist", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("app", "DoesNotExist")}}, false},
		{"unknown operator never matches", sidecarconfig.Selector{MatchExpressions: []sidecarconfig.Requirement{req("app", "Gt", "1")}}, false},
		{"labels and expressions together", sidecarconfig.Selector{
			MatchLabels:      map[string]string{"app": "shop"},
			MatchExpressions: []sidecarconfig.Requirement{req("tier", "In", "web")},
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := selectorMatches(tt.sel, labels); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
