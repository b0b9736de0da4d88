package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

func TestReadH2loadLog(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      []time.Duration
		wantErr   bool
	}{
		{name: "200s counted", log: "1796069119548697\t200\t877\n1796069119548696\t200\t922\n",
			want: []time.Duration{877 * time.Microsecond, 922 * time.Microsecond}},
		{name: "other statuses skipped", log: "1\t200\t10\n2\t503\t20\n3\t200\t30\n",
			want: []time.Duration{10 * time.Microsecond, 30 * time.Microsecond}},
		{name: "nothing succeeded", log: "1\t503\t20\n", wantErr: true},
		{name: "empty", log: "", wantErr: true},
		{name: "malformed line", log: "1\t200\n", wantErr: true},
		{name: "bad duration", log: "1\t200\tx\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log.tsv")
			if err := os.WriteFile(path, []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readH2loadLog(path)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGRPCFrame checks the body h2load sends is one uncompressed gRPC
// message that decodes to the request.
func TestGRPCFrame(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3}
	b, err := grpcFrame(req)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		t.Fatalf("frame header % x does not announce %d uncompressed bytes", b[:5], len(b)-5)
	}
	var got rlsv3.RateLimitRequest
	if err := proto.Unmarshal(b[5:], &got); err != nil || !proto.Equal(&got, req) {
		t.Fatalf("frame decodes to %v (%v), want %v", &got, err, req)
	}
}
