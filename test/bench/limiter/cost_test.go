package main

import "testing"

func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=2000,usec=312420,usec_per_call=156.21,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_zrange:calls=6000,usec=182940,usec_per_call=30.49,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=61,usec_per_call=61.00,rejected_calls=0,failed_calls=0\r\n"
	st := commandStats(info)
	for name, want := range map[string]commandStat{
		"evalsha":          {calls: 2000, usec: 312420},
		"zrange":           {calls: 6000, usec: 182940},
		"config|resetstat": {calls: 1, usec: 61},
		"fcall":            {},
	} {
		if got := st[name]; got != want {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
	if len(st) != 3 {
		t.Errorf("got %d commands, want 3: %v", len(st), st)
	}
}
