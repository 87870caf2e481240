//go:build !unix

package main

import "os"

// termWidth is unknown here: lines are not cut.
func termWidth(*os.File) int { return 0 }
