package mdsection

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReplace(t *testing.T) {
	for _, tc := range []struct {
		name, in, next, want string
	}{
		{"inserted before next", "## A\n\nx\n\n### Last\n\ny\n", "### Last", "## A\n\nx\n\n### Mine\n\nnew\n\n### Last\n\ny\n"},
		{"replaced before next", "## A\n\nx\n\n### Mine\n\nold\n\n### Mine too\n\nold\n\n### Last\n\ny\n", "### Last", "## A\n\nx\n\n### Mine\n\nnew\n\n### Last\n\ny\n"},
		{"replaced at the end", "## A\n\nx\n\n### Mine\n\nold\n", "", "## A\n\nx\n\n### Mine\n\nnew\n"},
		{"appended", "## A\n\nx\n", "", "## A\n\nx\n\n### Mine\n\nnew\n"},
		{"no file", "", "### Last", "### Mine\n\nnew\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.md")
			if tc.in != "" {
				if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := Replace(path, "### Mine", tc.next, "\n### Mine\n\nnew\n"); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path)
			if string(got) != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
