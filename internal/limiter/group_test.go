package limiter

import (
	"reflect"
	"testing"
)

// TestSplit: which requests one script decides together. keys[i] == ""
// marks an invalid request, which is in no group.
func TestSplit(t *testing.T) {
	type grp struct {
		Idx  []int
		Keys []string
	}
	// Keys as Key builds them: the hash tag is {rule:client}.
	a1, a2, b := "p:{a:1}", "p:{a:2}", "p:{b:1}"
	for _, tc := range []struct {
		name string
		gr   grouping
		keys []string
		want []grp
	}{
		{"one request", groupTag, []string{a1}, []grp{{[]int{0}, []string{a1}}}},
		{"one invalid request", groupAll, []string{""}, nil},
		{"standalone: one group, invalid left out", groupAll, []string{a1, "", b}, []grp{{[]int{0, 2}, []string{a1, b}}}},
		{"all invalid", groupAll, []string{"", ""}, nil},
		{"hash tags", groupTag, []string{a1, b, a1, "", a2}, []grp{
			{[]int{0, 2}, []string{a1, a1}}, {[]int{1}, []string{b}}, {[]int{4}, []string{a2}},
		}},
		{"cluster slots", groupSlot, []string{a1, b, "", a1}, []grp{
			{[]int{0, 3}, []string{a1, a1}}, {[]int{1}, []string{b}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []grp
			for _, g := range tc.gr.split(tc.keys) {
				got = append(got, grp{g.idx, g.keys})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("groups:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestSplitOneRequestInline: the one-request group uses its own buffers,
// so the hot path allocates only the group.
func TestSplitOneRequestInline(t *testing.T) {
	gs := groupTag.split([]string{"k"})
	if &gs[0].idx[0] != &gs[0].idxBuf[0] || &gs[0].keys[0] != &gs[0].keyBuf[0] {
		t.Error("the one-request group does not use its inline buffers")
	}
}
