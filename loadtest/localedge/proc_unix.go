//go:build unix

package localedge

import (
	"os/exec"
	"syscall"
)

var terminate = syscall.SIGTERM

func killGroup(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
