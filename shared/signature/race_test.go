//go:build race

package signature_test

const raceEnabled = true
