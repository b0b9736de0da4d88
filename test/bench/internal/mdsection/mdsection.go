// Package mdsection replaces one section of a benchmark report in place,
// for the programs' flags that measure a part alone (a busy machine's
// figures for that part, a quiet run's for the rest).
package mdsection

import (
	"os"
	"strings"
)

// Replace rewrites the file at path so that text stands where the section
// starting at the line heading stood, up to the line next (or the end);
// without that section, text goes before next, or at the end. heading
// and next are whole lines, e.g. "### Deny cache under attack"; next ""
// means the section runs to the end.
func Replace(path, heading, next, text string) error {
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(raw)
	before, after := s, ""
	if next != "" {
		if i := strings.Index(s, "\n"+next+"\n"); i >= 0 {
			before, after = s[:i+1], s[i+1:]
		}
	}
	if i := strings.Index(before, "\n"+heading+"\n"); i >= 0 {
		before = before[:i+1]
	}
	before = strings.TrimRight(before, "\n")
	if before != "" {
		before += "\n\n"
	}
	text = strings.Trim(text, "\n") + "\n"
	if after != "" {
		text += "\n"
	}
	return os.WriteFile(path, []byte(before+text+after), 0o644)
}
