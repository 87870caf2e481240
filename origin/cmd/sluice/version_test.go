package main

import (
	"runtime/debug"
	"testing"
)

// A binary built without make names the commit it was built from, so a
// subscriber's user-agent tells builds apart.
func TestBuiltVersion(t *testing.T) {
	t.Parallel()
	built := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Settings: settings}, true }
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}
	for _, c := range []struct {
		stamped string
		read    func() (*debug.BuildInfo, bool)
		want    string
	}{
		{"v1.2.0", built(rev), "v1.2.0"},
		{"dev", built(rev), "0123456789ab"},
		{"dev", built(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "0123456789ab-dirty"},
		{"dev", built(rev, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "0123456789ab"},
		{"dev", built(), "dev"},
		{"dev", func() (*debug.BuildInfo, bool) { return nil, false }, "dev"},
	} {
		if got := builtVersion(c.stamped, c.read); got != c.want {
			t.Errorf("builtVersion(%q, …) = %q, want %q", c.stamped, got, c.want)
		}
	}
}
