//go:build !unix

package localedge

import (
	"os"
	"os/exec"
	"syscall"
)

var terminate = os.Kill

func groupAttr() *syscall.SysProcAttr { return nil }

func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
