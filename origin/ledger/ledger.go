// Package ledger is sluice's durable store: events, deliveries, attempts and
// subscribers in one SQLite file in WAL mode. It is the only importer of the
// SQLite driver. All writes go through one connection in a group-commit loop
// (concurrent writers would starve each other in SQLite's busy handler, and a
// commit, not a row, is what costs); reads use a separate pool.
package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/migrations"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// ErrClosed is returned for writes submitted after Close.
var ErrClosed = errors.New("ledger is closed")

// Options tune Open; zero values take the defaults.
type Options struct {
	Now     func() time.Time // the clock stamped on rows; default time.Now
	Readers int              // read connections; default 4
}

// Ledger is an open database file owned by this process.
type Ledger struct {
	now   func() time.Time
	path  string // absolute, so Ping finds the file whatever the working folder
	wdb   *sql.DB
	wconn *sql.Conn
	rdb   *sql.DB
	cdb   *sql.DB // the checkpointer's connection
	lock  *dbLock
	ops   chan op
	quit  chan struct{}
	done  chan struct{}
	// checkpointed closes when the checkpoint loop has stopped.
	checkpointed chan struct{}
	closed       sync.Once
	stmts        statements

	// patterns maps each subscriber to its event-type patterns. Only the
	// write loop touches it (and Open, before the loop starts), so fan-out
	// always sees exactly the subscribers committed before it.
	patterns map[string][]string
	// bornAfter is, for a subscriber created while this ledger is open,
	// the highest delivery seq at its creation (write loop only, like
	// patterns). A result for a delivery at or below it belongs to an
	// earlier subscriber of the same id, removed with its rows while the
	// attempt was out: it is not recorded against the new one.
	bornAfter map[string]int64

	baseChanges int64 // total_changes() once Open had finished its own writes
	admitter    Admitter
	released    int // deliveries Open took back from a process that stopped with them in flight

	sent   sentTotals
	window windows
	prune  pruner

	countsMu  sync.Mutex // guards the last Counts answer, the one under way and countsGen
	counting  *countRun
	countsGen int // moves when a subscriber is removed
	// committing is held from a batch's COMMIT through its after-commit
	// steps; Counts holds it while it fixes its read snapshot and copies
	// the in-memory sent totals, so the two show the same moment.
	committing sync.Mutex
	counts     map[string]*SubscriberStats
	countsAt   time.Time

	// writeFailed is the last batch the write loop could not commit: Ping
	// fails for writeFailedFor after it, whatever commits meanwhile (a
	// commit may write nothing, and an idle server may not write at all).
	writeFailed atomic.Pointer[failedWrite]
}

// failedWrite is a batch that could not commit, and when.
type failedWrite struct {
	err error
	at  time.Time
}

// writeFailedFor is how long a failed write keeps Ping failing: a write
// failing again and again keeps it failing; one that failed once stops
// counting against the database after this long.
const writeFailedFor = 30 * time.Second

// pragmas are the production settings, applied to every connection: WAL so
// readers never block the writer, synchronous=NORMAL (durable across a
// process crash; an fsync per checkpoint rather than per commit), a busy
// timeout for the readers, and an in-memory temp store.
var pragmas = []string{
	"journal_mode(WAL)",
	"synchronous(NORMAL)",
	"busy_timeout(5000)",
	"temp_store(MEMORY)",
	"foreign_keys(OFF)",
}

// Page caches are per connection: the writer's holds the hot index pages
// of every claim and insert; readers share the OS page cache and need less.
const (
	writerCache = "cache_size(-32768)" // 32 MiB
	readerCache = "cache_size(-8192)"  // 8 MiB each
)

// role is what a connection is for; each gets its own cache size.
type role int

const (
	writerRole role = iota
	readerRole
	checkpointerRole // copies the WAL back; reads no tables
)

func dsn(path string, r role) string {
	q := url.Values{}
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	switch r {
	case readerRole:
		q.Add("_pragma", "query_only(1)")
		q.Add("_pragma", readerCache)
	case writerRole:
		q.Add("_pragma", writerCache)
		// The checkpointer copies the WAL back, not the committing writer.
		q.Add("_pragma", "wal_autocheckpoint(0)")
	case checkpointerRole:
		q.Add("_pragma", "cache_size(-1024)")
	}
	return "file:" + uriPath(path) + "?" + q.Encode()
}

// uriPath escapes what SQLite's file: URIs read as their own in a path:
// with "a#b.db" or "a?b.db" as --db, SQLite would open "a" while the lock
// is on the whole name. An absolute path gets an empty authority first
// ("file:///tmp/x.db"), or "//tmp/x.db" would be read as one. The path is
// not cleaned: the kernel resolves "link/.." through the link, as the lock
// does, and a cleaned path could name another file.
func uriPath(path string) string {
	escaped := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	if strings.HasPrefix(path, "/") {
		return "//" + escaped
	}
	return escaped
}

// Open opens (creating it and its folder if needed) the ledger at path,
// refuses if another process holds it, applies pending migrations and puts
// every delivery a crashed predecessor left in flight back to pending.
func Open(ctx context.Context, path string, o Options) (*Ledger, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Readers <= 0 {
		o.Readers = 4
	}
	lock, err := lockDatabase(path)
	if err != nil {
		return nil, err
	}
	// Absolute, but not cleaned: filepath.Abs would drop "link/.." as
	// text, and Ping would look at another file than the one held.
	abs := path
	if !filepath.IsAbs(path) {
		wd, err := os.Getwd()
		if err != nil {
			lock.release()
			return nil, err
		}
		abs = wd + string(filepath.Separator) + path
	}
	l := &Ledger{now: o.Now, path: abs, lock: lock, ops: make(chan op, 1024), quit: make(chan struct{}), done: make(chan struct{}),
		checkpointed: make(chan struct{})}
	fail := func(err error) (*Ledger, error) {
		l.closeDBs()
		lock.release()
		return nil, err
	}
	if l.wdb, err = sql.Open("sqlite", dsn(path, writerRole)); err != nil {
		return fail(err)
	}
	l.wdb.SetMaxOpenConns(1)
	l.wdb.SetMaxIdleConns(1)
	l.wdb.SetConnMaxLifetime(0)
	if _, err := migrations.Apply(ctx, l.wdb, o.Now()); err != nil {
		return fail(fmt.Errorf("apply migrations: %w", err))
	}
	if l.wconn, err = l.wdb.Conn(ctx); err != nil {
		return fail(err)
	}
	if err := l.stmts.prepare(ctx, l.wconn); err != nil {
		return fail(fmt.Errorf("prepare statements: %w", err))
	}
	if l.rdb, err = sql.Open("sqlite", dsn(path, readerRole)); err != nil {
		return fail(err)
	}
	l.rdb.SetMaxOpenConns(o.Readers)
	l.rdb.SetMaxIdleConns(o.Readers)
	released, err := l.wconn.ExecContext(ctx,
		`UPDATE deliveries SET status = 'pending', lease_until = NULL WHERE status = 'inflight'`)
	if err != nil {
		return fail(fmt.Errorf("release leases: %w", err))
	}
	if n, err := released.RowsAffected(); err == nil {
		l.released = int(n)
	}
	if err := l.loadPatterns(ctx); err != nil {
		return fail(err)
	}
	if err := l.recountSent(ctx, l.wconn); err != nil {
		return fail(fmt.Errorf("count sent deliveries: %w", err))
	}
	if err := l.wconn.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&l.baseChanges); err != nil {
		return fail(err)
	}
	if l.cdb, err = sql.Open("sqlite", dsn(path, checkpointerRole)); err != nil {
		return fail(err)
	}
	l.cdb.SetMaxOpenConns(1)
	go l.writeLoop()
	go l.checkpointLoop()
	return l, nil
}

// lockDatabase makes the database's folder if needed and takes the lock
// that keeps a second process off the file.
func lockDatabase(path string) (*dbLock, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil { // a new folder is the owner's alone, like the file
			return nil, fmt.Errorf("create database folder: %w", err)
		}
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, fmt.Errorf("%s is a folder, not a database file", path)
	}
	lock, err := lockDatabaseFile(path)
	if err != nil {
		return nil, err
	}
	if err := refuseForeign(path); err != nil {
		lock.discard()
		return nil, err
	}
	// The file holds every subscriber's secret: only its owner may read it,
	// including a file an older sluice made 0644. SQLite gives new -wal and
	// -shm files the database's mode; existing ones are set here. A file
	// owned by another user keeps the mode its owner chose.
	lock.file.Chmod(0o600)
	for _, side := range []string{path + "-wal", path + "-shm"} {
		os.Chmod(side, 0o600)
	}
	return lock, nil
}

// refuseForeign refuses another program's SQLite database before anything
// changes it (its mode, its journal mode, a table), reading it through a
// read-only connection. A check that cannot run says nothing: migrating
// checks again.
func refuseForeign(path string) error {
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		return nil // new: nothing to refuse
	}
	db, err := sql.Open("sqlite", "file:"+uriPath(path)+"?mode=ro")
	if err != nil {
		return nil
	}
	defer db.Close()
	if err := migrations.CheckOwner(context.Background(), db); errors.Is(err, migrations.ErrForeign) {
		return err
	}
	return nil
}

// Migrate applies pending migrations to the database at path and returns
// their names, holding the same lock as Open.
func Migrate(ctx context.Context, path string, now time.Time) ([]string, error) {
	lock, err := lockDatabase(path)
	if err != nil {
		return nil, err
	}
	defer lock.release()
	db, err := sql.Open("sqlite", dsn(path, writerRole))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	return migrations.Apply(ctx, db, now)
}

// Close stops the write loop after the writes already submitted and closes
// the database.
func (l *Ledger) Close() error {
	var err error
	l.closed.Do(func() {
		close(l.quit)
		<-l.done
		<-l.checkpointed
		l.stmts.close()
		err = l.closeDBs()
		l.lock.release()
	})
	return err
}

func (l *Ledger) closeDBs() error {
	var errs []error
	if l.wconn != nil {
		errs = append(errs, l.wconn.Close())
	}
	if l.wdb != nil {
		errs = append(errs, l.wdb.Close())
	}
	if l.rdb != nil {
		errs = append(errs, l.rdb.Close())
	}
	if l.cdb != nil {
		errs = append(errs, l.cdb.Close())
	}
	return errors.Join(errs...)
}

// Changes is the number of rows this process has inserted, updated or
// deleted since it opened the ledger: the write budget benchmarks and tests
// hold the engine to.
func (l *Ledger) Changes(ctx context.Context) (int64, error) {
	var n int64
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		return w.conn.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&n)
	})
	return n - l.baseChanges, err
}

// Released is how many deliveries Open found in flight, left by a process
// that stopped without recording them, and put back to pending: each goes
// again, so its receiver may see it twice.
func (l *Ledger) Released() int { return l.released }

// Ping checks that the database answers: that the last write committed,
// that the file still starts as a SQLite database (read from the disk: a
// query may be answered from a connection's cache), and that a table reads.
func (l *Ledger) Ping(ctx context.Context) error {
	if f := l.writeFailed.Load(); f != nil && l.now().Sub(f.at) < writeFailedFor {
		return fmt.Errorf("a write failed %s ago: %w", l.now().Sub(f.at).Round(time.Second), f.err)
	}
	header := make([]byte, len(sqliteHeader))
	if _, err := l.lock.file.ReadAt(header, 0); err != nil {
		return fmt.Errorf("reading the database file: %w", err)
	}
	if string(header) != sqliteHeader {
		return errors.New("the database file no longer starts as a SQLite database")
	}
	if err := l.atPath(); err != nil {
		return err
	}
	var n int
	return l.rdb.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n)
}

// errGone is a database file deleted or replaced under the running process:
// it still answers through the handles held open on it, and takes writes
// that no restart will find.
var errGone = errors.New("the database file is no longer at its path (deleted or replaced): what is written now is lost at the next start")

// atPath checks that the file at the ledger's path is still the one it holds
// open: errGone when it is not, another error when the path cannot be
// looked up.
func (l *Ledger) atPath() error {
	atPath, err := os.Stat(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return errGone
	}
	if err != nil {
		// Another fault (a folder made unreadable, one replaced by a
		// file) is told as it is, without the path: the operator has it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("the database file cannot be looked up at its path: %w", err)
	}
	held, err := l.lock.file.Stat()
	if err != nil {
		return fmt.Errorf("the open database file: %w", err)
	}
	if !os.SameFile(atPath, held) {
		return errGone
	}
	return nil
}

// sqliteHeader opens every SQLite database file.
const sqliteHeader = "SQLite format 3\x00"

// op is one unit of work for the write loop. fn runs inside the batch's
// transaction; it must check everything that can fail for a domain reason
// (not found, conflict) before it writes, so returning such an error leaves
// the batch intact. Any other error rolls the whole batch back.
type op struct {
	fn   func(ctx context.Context, w *writer) error
	done chan error
	// urgent ops (claims: workers may be idle until they commit) end a
	// batch's linger at once.
	urgent bool
}

// domainError reports whether err is one an op returns without having written.
func domainError(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, ErrTooLarge)
}

// maxBatch bounds how many ops share one commit, so a flood of enqueues
// cannot delay a claim by more than one batch.
const maxBatch = 256

// write submits fn to the write loop and waits for its batch to commit.
// Once submitted, it waits even if ctx ends: the batch may still commit, and
// the caller must not report failure for a write that happened.
func (l *Ledger) write(ctx context.Context, fn func(ctx context.Context, w *writer) error) error {
	return l.submit(ctx, op{fn: fn, done: make(chan error, 1)})
}

// writeUrgent is write for an op whose batch should not linger.
func (l *Ledger) writeUrgent(ctx context.Context, fn func(ctx context.Context, w *writer) error) error {
	return l.submit(ctx, op{fn: fn, done: make(chan error, 1), urgent: true})
}

func (l *Ledger) submit(ctx context.Context, o op) error {
	select {
	case l.ops <- o:
	case <-l.quit:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-o.done
}

// A batch smaller than lingerBelow waits up to lingerFor for company: each
// commit writes every page it touched to the WAL (two writes per page), so
// under a stream of small writes fewer, fuller commits cost less CPU than
// the wait adds in latency. At 5,000 single-event POSTs a second on two
// cores, batches of 8 within 200 µs made ~950 commits a second and the
// writer fell behind in bursts (p99 enqueue→delivery 32–85 ms); 32 within
// 1 ms make ~350 and keep p99 near what a bare relay shows on the same
// machine. Only a batch that starts within lingerFor of the last commit
// waits: one write after a quiet spell has no company coming.
const (
	lingerBelow = 32
	lingerFor   = time.Millisecond
)

func (l *Ledger) writeLoop() {
	defer close(l.done)
	batch := make([]op, 0, maxBatch)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	var committed time.Time // when the last batch committed
	for {
		var first op
		select {
		case first = <-l.ops:
		case <-l.quit:
			// Finish what was submitted before Close.
			for {
				select {
				case o := <-l.ops:
					l.commit([]op{o})
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxBatch {
			select {
			case o := <-l.ops:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		if len(batch) < lingerBelow && time.Since(committed) < lingerFor &&
			!slices.ContainsFunc(batch, func(o op) bool { return o.urgent }) {
			linger.Reset(lingerFor)
		wait:
			for len(batch) < maxBatch {
				select {
				case o := <-l.ops:
					batch = append(batch, o)
					if o.urgent {
						break wait
					}
				case <-linger.C:
					break wait
				}
			}
			linger.Stop()
		}
		l.commit(batch)
		committed = time.Now()
	}
}

// checkpointEvery is how often the WAL is copied back into the database.
const checkpointEvery = 200 * time.Millisecond

// checkpointLoop copies committed WAL frames back into the database file
// from its own connection. Done by the committing writer (SQLite's
// default), the copy and its two fsyncs stall that commit, and every write
// queued behind it, for milliseconds several times a second under load; a
// passive checkpoint beside the writer blocks no one, and the writer
// starts the WAL over once a checkpoint has caught up.
func (l *Ledger) checkpointLoop() {
	defer close(l.checkpointed)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
			// A failed checkpoint leaves the frames in the WAL, where
			// readers still find them; the next tick tries again.
			l.cdb.Exec(`PRAGMA wal_checkpoint(PASSIVE)`)
		}
	}
}

// commit runs a batch of ops in one transaction.
func (l *Ledger) commit(batch []op) {
	ctx := context.Background()
	w := &writer{conn: l.wconn, s: &l.stmts, now: l.now()}
	results := make([]error, len(batch))
	err := func() error {
		// Nothing is acknowledged that the next start will not find. A
		// path that cannot be looked up (a folder made unreadable) still
		// holds the file the writes go to.
		if err := l.atPath(); errors.Is(err, errGone) {
			return err
		}
		if _, err := l.stmts.begin.ExecContext(ctx); err != nil {
			// A ROLLBACK that failed leaves its transaction open, and this
			// BEGIN fails: end it and begin again rather than fail the batch.
			if _, rerr := l.stmts.rollback.ExecContext(ctx); rerr != nil {
				return err
			}
			if _, err := l.stmts.begin.ExecContext(ctx); err != nil {
				return err
			}
		}
		for i, o := range batch {
			if err := o.fn(ctx, w); err != nil {
				if !domainError(err) {
					return err
				}
				results[i] = err
			}
		}
		// The commit and what follows it (the sent totals) happen as one
		// step to Counts, which reads both.
		l.committing.Lock()
		defer l.committing.Unlock()
		_, err := l.stmts.commit.ExecContext(ctx)
		if err == nil {
			for _, f := range w.after {
				f()
			}
		}
		return err
	}()
	if err != nil {
		l.writeFailed.Store(&failedWrite{err: err, at: l.now()})
		l.stmts.rollback.ExecContext(ctx)
		for i := len(w.undo) - 1; i >= 0; i-- {
			w.undo[i]()
		}
		l.staleSent()
		// Ops may have updated patterns before the rollback undid them.
		if lerr := l.loadPatterns(ctx); lerr != nil {
			err = errors.Join(err, lerr)
		}
		for i := range results {
			results[i] = fmt.Errorf("%w: %w", ErrWriteFailed, err)
		}
	}
	for i, o := range batch {
		o.done <- results[i]
	}
}

// writer is what an op sees: the writer connection, its prepared statements,
// and the batch's timestamp.
type writer struct {
	conn  *sql.Conn
	s     *statements
	now   time.Time
	after []func() // run in order once the batch has committed
	undo  []func() // run in reverse order when the batch rolls back
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}
