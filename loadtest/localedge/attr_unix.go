//go:build unix && !linux

package localedge

import "syscall"

// groupAttr puts the Worker's node and workerd in a group of their own, to
// be stopped together.
func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
