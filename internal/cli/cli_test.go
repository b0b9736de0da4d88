package cli

import (
	"bytes"
	"flag"
	"log/slog"
	"strings"
	"testing"
)

func TestApplyEnv(t *testing.T) {
	env := map[string]string{
		"SLIDEGATE_LISTEN_ADDRESS": ":9000",
		"SLIDEGATE_LOG_LEVEL":      "debug",
		"SLIDEGATE_UNKNOWN":        "ignored",
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	listen := fs.String("listen-address", ":8080", "")
	level := fs.String("log-level", "info", "")
	untouched := fs.String("config-file", "/etc/x", "")
	if err := fs.Parse([]string{"--log-level=warn"}); err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := ApplyEnv(fs, lookup); err != nil {
		t.Fatal(err)
	}
	if *listen != ":9000" || *level != "warn" || *untouched != "/etc/x" {
		t.Errorf("listen %q (want the environment's), level %q (want the flag's), config %q (want the default)", *listen, *level, *untouched)
	}

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Duration("decision-timeout", 0, "")
	_ = fs.Parse(nil)
	err := ApplyEnv(fs, func(string) (string, bool) { return "soon", true })
	if err == nil || !strings.Contains(err.Error(), "SLIDEGATE_DECISION_TIMEOUT") {
		t.Errorf("a bad value: error %v, want one naming the variable", err)
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "verbose", "info+"} {
		if _, err := ParseLevel(in); err == nil {
			t.Errorf("ParseLevel(%q): no error", in)
		}
	}
}

func TestNewLoggerLevel(t *testing.T) {
	var b bytes.Buffer
	log := NewLogger(&b, slog.LevelWarn)
	log.Info("hidden")
	log.Warn("shown")
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("output %q: want only the warning, as JSON", out)
	}
}
