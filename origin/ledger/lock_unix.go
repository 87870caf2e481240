//go:build unix

package ledger

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile opens path, creating it, and takes an exclusive advisory lock on
// it that the kernel drops when the process dies, so a crashed owner never
// leaves a stale lock behind. flock locks are apart from the POSIX locks
// SQLite takes on the same file.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open database file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock database: %w", err)
	}
	return f, nil
}

func unlockFile(f *os.File) {
	if f != nil {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}
