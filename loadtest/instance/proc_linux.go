package instance

import "syscall"

// sysProcAttr makes the kernel kill sluice if the harness dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
