package main

import "testing"

// --max-body takes sizes with units up to 1 GiB; anything that would
// overflow (and wrap a batch's limit, 16 times it, negative) is refused.
func TestByteSizeFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"256KiB": 256 << 10, "1MiB": 1 << 20, "65536": 65536, "2KB": 2000, "1024MiB": 1 << 30,
	} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, int64(b), err, want)
		}
	}
	for _, in := range []string{"", "0", "-1KiB", "1025MiB", "9223372036854775807MiB", "9223372036854775807", "ten", "1.5MiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
}
