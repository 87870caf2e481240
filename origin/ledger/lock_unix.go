//go:build unix

package ledger

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// dbLock keeps other sluice processes, and other ledgers of this one, off a
// database file. Its flock is on the file itself, so a symlink or a hard
// link to the file meets it; the kernel drops it when the process dies, so
// a crashed owner never leaves a stale lock behind. flock locks are apart
// from the POSIX locks SQLite takes on the same file.
type dbLock struct {
	file *os.File
	id   fileID
	// legacy are the side files sluice locked before: path + ".lock", as
	// given and beside the file a symlink points to.
	legacy []*os.File
	// strays are descriptors of this file opened by refused locks that
	// found it held only once open: closed with the lock, never before.
	strays []*os.File
	// made are the side files this lock created, removed by discard.
	made []string
}

// fileID names a file whatever the path to it.
type fileID struct{ dev, ino uint64 }

// held are the files this process has locked. A second lock of one is
// refused without opening the file again: closing any descriptor of a file
// drops every POSIX lock the process holds on it, SQLite's included. It is
// process-wide because those locks are.
var held = struct {
	sync.Mutex
	ids map[fileID]*dbLock
}{ids: map[fileID]*dbLock{}}

func idOf(st os.FileInfo) (fileID, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(sys.Dev), ino: uint64(sys.Ino)}, true
}

// lockDatabaseFile opens path, creating it with mode 0600, and locks it.
func lockDatabaseFile(path string) (*dbLock, error) {
	held.Lock()
	defer held.Unlock()
	if st, err := os.Stat(path); err == nil {
		if id, ok := idOf(st); ok && held.ids[id] != nil {
			return nil, ErrLocked
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open database file: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open database file: %w", err)
	}
	id, _ := idOf(st)
	if owner := held.ids[id]; owner != nil {
		// A held file linked or renamed onto path since the Stat: closing
		// f now would drop SQLite's locks, so its owner closes it.
		owner.strays = append(owner.strays, f)
		return nil, ErrLocked
	}
	// Not held here, so this process has no POSIX lock on it to lose when
	// f is closed on a refusal.
	if err := checkHeader(f, path); err != nil {
		f.Close()
		return nil, err
	}
	if err := flock(f); err != nil {
		f.Close()
		return nil, err
	}
	l := &dbLock{file: f, id: id}
	sides := []string{path + ".lock"}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		sides = append(sides, target+".lock")
	}
	for _, side := range sides {
		_, statErr := os.Lstat(side)
		lf, err := os.OpenFile(side, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil && errors.Is(statErr, fs.ErrNotExist) {
			l.made = append(l.made, side)
		}
		if err == nil && l.lockedSide(lf) {
			// The same side file by another spelling ("./data", a
			// symlinked folder): a second flock of it would meet the first.
			lf.Close()
			continue
		}
		if err == nil {
			if err = flock(lf); err != nil {
				lf.Close()
			}
		}
		if err != nil {
			for _, g := range append(l.legacy, f) {
				g.Close()
			}
			return nil, err
		}
		l.legacy = append(l.legacy, lf)
	}
	held.ids[id] = l
	return l, nil
}

// checkHeader refuses a file that is not a SQLite database before anything
// changes it: it keeps its mode and gets no lock file beside it. An empty
// file passes, as a database yet to be written (or one whose pages are all
// still in its WAL).
func checkHeader(f *os.File, path string) error {
	head := make([]byte, len(sqliteHeader))
	n, err := f.ReadAt(head, 0)
	if n == 0 && errors.Is(err, io.EOF) {
		return nil
	}
	if string(head[:n]) != sqliteHeader {
		return fmt.Errorf("%s is not a SQLite database; choose another --db", path)
	}
	return nil
}

// lockedSide reports whether f is a side file l already locked.
func (l *dbLock) lockedSide(f *os.File) bool {
	st, err := f.Stat()
	if err != nil {
		return false
	}
	for _, g := range l.legacy {
		if gst, err := g.Stat(); err == nil && os.SameFile(st, gst) {
			return true
		}
	}
	return false
}

// flock takes f's exclusive lock, or fails with ErrLocked. A flock lives on
// the open file, not the descriptor, and fork copies descriptors: a lock
// this process released a moment ago stays held by any child it forked
// meanwhile until that child execs and closes the copy. So a lock found
// held is tried again for lockPatience before the refusal stands.
func flock(f *os.File) error {
	deadline := time.Now().Add(lockPatience)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return fmt.Errorf("lock database: %w", err)
		case time.Now().After(deadline):
			return ErrLocked
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lockPatience is how long flock waits out a lock held by a child forked
// before its release: far longer than a fork takes to exec.
const lockPatience = 250 * time.Millisecond

// discard is release for a file Open refused: the side files this lock
// created go too, so a refusal leaves nothing beside the file.
func (l *dbLock) discard() {
	if l == nil {
		return
	}
	for _, side := range l.made {
		os.Remove(side)
	}
	l.release()
}

// release drops the lock (closing a descriptor drops its flock). SQLite
// must have closed the file first. It closes under held's mutex, so no new
// ledger of the file can take its POSIX locks before the last descriptor
// here is closed.
func (l *dbLock) release() {
	if l == nil {
		return
	}
	held.Lock()
	defer held.Unlock()
	for _, f := range append(append(l.legacy, l.file), l.strays...) {
		f.Close()
	}
	delete(held.ids, l.id)
}
