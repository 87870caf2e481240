//go:build !linux

package instance

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
