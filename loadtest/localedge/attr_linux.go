package localedge

import "syscall"

// groupAttr puts the Worker's node and workerd in a group of their own, to
// be stopped together, and sends node SIGTERM should the harness die without
// stopping it (a test binary killed at its timeout, say): node then stops
// workerd too, which a SIGKILL would leave running.
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
