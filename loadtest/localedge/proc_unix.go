//go:build unix

package localedge

import (
	"os/exec"
	"syscall"
)

var terminate = syscall.SIGTERM

func groupAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func killGroup(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
