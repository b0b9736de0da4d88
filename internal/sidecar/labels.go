package sidecar

import (
	"bytes"
	"fmt"
	"strconv"
)

// maxLabelsFileBytes bounds the downward-API labels file (Kubernetes limits
// all of a pod's labels well below this).
const maxLabelsFileBytes = 1 << 20

// ParseLabels reads a Kubernetes downward-API labels file: one
// key="value" per line, the value quoted and escaped Go-style. Blank lines
// are ignored.
func ParseLabels(data []byte) (map[string]string, error) {
	if len(data) > maxLabelsFileBytes {
		return nil, fmt.Errorf("labels file is larger than %d bytes", maxLabelsFileBytes)
	}
	labels := map[string]string{}
	for n, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		k, v, ok := bytes.Cut(line, []byte("="))
		if !ok || len(k) == 0 {
			return nil, fmt.Errorf("labels line %d: not key=\"value\"", n+1)
		}
		value, err := strconv.Unquote(string(v))
		if err != nil {
			return nil, fmt.Errorf("labels line %d: value is not a quoted string: %w", n+1, err)
		}
		labels[string(k)] = value
	}
	return labels, nil
}
