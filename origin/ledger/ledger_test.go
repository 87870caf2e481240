package ledger

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/migrations"
	"github.com/sluice-dev/sluice/shared/fakeclock"
	"os/exec"
	"sync"
)

var t0 = time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)

func open(t *testing.T) (*Ledger, *fakeclock.Clock, string) {
	t.Helper()
	clock := fakeclock.New(t0)
	path := filepath.Join(t.TempDir(), "sluice.db")
	l, err := Open(context.Background(), path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clock, path
}

func addSubscriber(t *testing.T, l *Ledger, id string, types ...string) {
	t.Helper()
	s := &Subscriber{ID: id, URL: "http://127.0.0.1:1/" + id, EventTypes: types,
		Rate: Rate{PerSecond: 10, Burst: 20}, MaxAttempts: 3, TimeoutMS: 1000, Secret: "whsec_x"}
	if err := l.CreateSubscriber(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func TestSecondProcessIsRefused(t *testing.T) {
	t.Parallel()
	path, sqliteLocks := openWatched(t)
	if _, err := Open(context.Background(), path, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if _, err := Migrate(context.Background(), path, t0); !errors.Is(err, ErrLocked) {
		t.Fatalf("Migrate beside an open ledger = %v, want ErrLocked", err)
	}
	// Another name for the same file is the same database.
	other := t.TempDir()
	symlink, hardlink := filepath.Join(other, "symlink.db"), filepath.Join(other, "hardlink.db")
	if err := os.Symlink(path, symlink); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, hardlink); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{symlink, hardlink} {
		if _, err := Open(context.Background(), p, Options{}); !errors.Is(err, ErrLocked) {
			t.Errorf("Open through %s = %v, want ErrLocked", filepath.Base(p), err)
		}
	}
	// Refusing did not close a descriptor of the file, which would have
	// dropped the locks SQLite holds on it in this process.
	if now := steadyLocks(t, path); now != sqliteLocks {
		t.Errorf("SQLite's POSIX locks on the file: %d before the refusals, %d after", sqliteLocks, now)
	}
}

// openWatched opens a ledger and returns its path and the POSIX locks
// SQLite holds on it, which tests watch for a refusal that drops them.
func openWatched(t *testing.T) (string, int) {
	t.Helper()
	_, _, path := open(t)
	n := steadyLocks(t, path)
	if n == 0 {
		t.Fatal("SQLite holds no POSIX lock on the open database: nothing to watch")
	}
	return path, n
}

// posixLocks counts the POSIX locks this process holds on path's file, from
// /proc/locks.
// steadyLocks is the fewest POSIX locks this process holds on path over
// 300 ms: the locks SQLite keeps while the database is open, without those
// a checkpoint or a read takes for a moment. A descriptor of the file
// closed elsewhere in the process drops every one of them for good, so
// that shows as fewer here too.
func steadyLocks(t *testing.T, path string) int {
	t.Helper()
	least := posixLocks(t, path)
	for range 15 {
		time.Sleep(20 * time.Millisecond)
		least = min(least, posixLocks(t, path))
	}
	return least
}

func posixLocks(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Skipf("no /proc/locks to read the locks from: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	ino := strconv.FormatUint(st.Sys().(*syscall.Stat_t).Ino, 10)
	pid := strconv.Itoa(os.Getpid())
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		// 1: POSIX  ADVISORY  READ 1234 fd:01:5678 128 128
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "POSIX" && f[4] == pid && strings.HasSuffix(f[5], ":"+ino) {
			n++
		}
	}
	return n
}

// A sluice from before the lock moved onto the database file locked a file
// beside the path it was given: a database it holds is refused too, through
// the same path and through a symlink it was given.
func TestAnOlderSluicesLockIsHonoured(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file, link := filepath.Join(dir, "sluice.db"), filepath.Join(dir, "link.db")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, given := range []string{file, link} {
		older, err := os.OpenFile(given+".lock", os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(older.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(context.Background(), given, Options{}); !errors.Is(err, ErrLocked) {
			t.Errorf("Open of %s beside an older sluice given it = %v, want ErrLocked", filepath.Base(given), err)
		}
		older.Close() // the older sluice lets go
		l, err := Open(context.Background(), given, Options{})
		if err != nil {
			t.Fatalf("Open of %s once the older sluice let go: %v", filepath.Base(given), err)
		}
		l.Close()
	}
}

// The file holds the subscribers' secrets and the API token's digest.
func TestDatabaseFileIsTheOwnersAlone(t *testing.T) {
	t.Parallel()
	_, _, path := open(t)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if mode := st.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %v, want -rw-------", filepath.Base(p), mode)
		}
	}
	// A folder Open makes for the file is the owner's alone too.
	nested := filepath.Join(t.TempDir(), "data", "sluice.db")
	if fresh, err := Open(context.Background(), nested, Options{}); err != nil {
		t.Fatal(err)
	} else {
		fresh.Close()
	}
	if st, err := os.Stat(filepath.Dir(nested)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the database folder Open made: %v, %v; want drwx------", st.Mode().Perm(), err)
	}
	// A file an older sluice left world-readable is made the owner's alone.
	old := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(old, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(old, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	l, err := Open(context.Background(), old, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if st, err := os.Stat(old); err != nil {
		t.Fatal(err)
	} else if st.Mode().Perm() != 0o600 {
		t.Errorf("an existing 0644 database has mode %v after Open, want -rw-------", st.Mode().Perm())
	}
	dir := t.TempDir()
	if _, err := Open(context.Background(), dir, Options{}); err == nil || !strings.Contains(err.Error(), "is a folder") {
		t.Errorf("Open on a folder = %v, want an error saying it is a folder", err)
	}
}

func TestMigrationsApplyOnceAndAreRecorded(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.db")
	first, err := Migrate(context.Background(), path, t0)
	if err != nil || len(first) == 0 {
		t.Fatalf("first Migrate = %v, %v", first, err)
	}
	again, err := Migrate(context.Background(), path, t0)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Migrate applied %v, %v; want nothing", again, err)
	}
	l, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var n int
	if err := l.rdb.QueryRow(`SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(first) {
		t.Fatalf("schema_migrations holds %d rows (%v), want %d", n, err, len(first))
	}
	var mode string
	if err := l.wconn.QueryRowContext(context.Background(), `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q (%v), want wal", mode, err)
	}
}

// An enqueue that would fan out past MaxFanOut is refused before it writes
// anything; one of the same events to fewer subscribers goes in.
func TestEnqueueRefusesAFanOutPastTheBound(t *testing.T) {
	t.Parallel()
	l, _, _ := open(t)
	ctx := context.Background()
	const subs = 101
	for i := range subs {
		addSubscriber(t, l, fmt.Sprintf("all-%03d", i), "*")
	}
	addSubscriber(t, l, "few", "video.few")
	batch := func(typ string) []NewEvent {
		var evs []NewEvent
		for i := range MaxFanOut / (subs - 1) {
			id := fmt.Sprintf("%s-%d", typ, i)
			evs = append(evs, NewEvent{ID: id, Type: typ, Body: []byte(`{"id":"` + id + `"}`)})
		}
		return evs
	}
	_, err := l.Enqueue(ctx, batch("video.many")) // 1,000 events × 101 subscribers
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "101000 deliveries") {
		t.Fatalf("Enqueue of a 101,000-delivery fan-out = %v, want ErrTooLarge naming the count", err)
	}
	var events, deliveries int
	l.rdb.QueryRow(`SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries)`).Scan(&events, &deliveries)
	if events != 0 || deliveries != 0 {
		t.Fatalf("a refused enqueue stored %d events and %d deliveries", events, deliveries)
	}
	if err := l.DeleteSubscriber(ctx, "all-000"); err != nil {
		t.Fatal(err)
	}
	res, err := l.Enqueue(ctx, batch("video.many")) // 1,000 × 100: at the bound
	if err != nil || res.Events[0].Deliveries != 100 {
		t.Fatalf("Enqueue at the bound = %v, %v; want 100 deliveries per event", res.Events[0], err)
	}
}

func TestEnqueueIsIdempotentAndFansOutByType(t *testing.T) {
	t.Parallel()
	l, _, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "trending", "video.trending")
	addSubscriber(t, l, "all", "*")
	addSubscriber(t, l, "videos", "video.*")
	addSubscriber(t, l, "billing", "invoice.paid")

	res, err := l.Enqueue(ctx, []NewEvent{{ID: "e1", Type: "video.trending", Body: []byte(`{"id":"e1","type":"video.trending"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Events[0]; e.Duplicate || e.Deliveries != 3 {
		t.Fatalf("first enqueue = %+v, want 3 deliveries", e)
	}
	if res.Subscribers["billing"] != 0 || res.Subscribers["trending"] != 1 {
		t.Fatalf("fan-out = %v", res.Subscribers)
	}
	res, err = l.Enqueue(ctx, []NewEvent{{ID: "e1", Type: "video.trending", Body: []byte(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Events[0]; !e.Duplicate || e.Deliveries != 0 || len(res.Subscribers) != 0 {
		t.Fatalf("repeat enqueue = %+v %v, want a duplicate that enqueued nothing", e, res.Subscribers)
	}
	batch := []NewEvent{
		{ID: "e2", Type: "invoice.paid", Body: []byte(`{}`)},
		{ID: "e1", Type: "video.trending", Body: []byte(`{}`)},
		{ID: "e2", Type: "invoice.paid", Body: []byte(`{}`)},
	}
	res, err = l.Enqueue(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	dups := 0
	for _, e := range res.Events {
		if e.Duplicate {
			dups++
		}
	}
	if dups != 2 || res.Subscribers["billing"] != 1 || res.Subscribers["all"] != 1 {
		t.Fatalf("batch: %d duplicates, fan-out %v; want 2 and billing+all once", dups, res.Subscribers)
	}
	_, ds, err := l.Event(ctx, "e2")
	if err != nil || len(ds) != 2 {
		t.Fatalf("e2 has %d deliveries (%v), want 2", len(ds), err)
	}
}

func TestClaimTakesDueWorkAndRecordsOutcomes(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	for i := range 5 {
		id := string(rune('a' + i))
		if _, err := l.Enqueue(ctx, []NewEvent{{ID: id, Type: "t", Body: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: "s", Max: 3, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	got := res[0]
	if len(got.Deliveries) != 3 || got.Drained {
		t.Fatalf("claim = %d deliveries, drained %v; want 3, false", len(got.Deliveries), got.Drained)
	}
	if got.Deliveries[0].EventID != "a" || string(got.Deliveries[0].Body) != `{}` {
		t.Fatalf("first claimed = %+v, want event a with its body", got.Deliveries[0])
	}
	// Record one sent, one retry in 10s, one dead; then claim the rest.
	a := func(n int) *Attempt { return &Attempt{Number: n, At: clock.Now(), Lane: LaneOrigin, StatusCode: 500} }
	ok := &Attempt{Number: 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: 200}
	ds := got.Deliveries
	err = l.Record(ctx, []Result{
		{Seq: ds[0].Seq, SubscriberID: "s", Attempt: ok, Status: StatusSent},
		{Seq: ds[1].Seq, SubscriberID: "s", Attempt: a(1), Status: StatusPending, NextAttemptAt: clock.Now().Add(10 * time.Second)},
		{Seq: ds[2].Seq, SubscriberID: "s", Attempt: a(1), Status: StatusDead},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err = l.Claim(ctx, []ClaimRequest{{SubscriberID: "s", Max: 3, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := res[0]; len(got.Deliveries) != 2 || !got.Drained || !got.NextDue.Equal(clock.Now().Add(10*time.Second)) {
		t.Fatalf("second claim = %d, drained %v, next due %v; want 2, true, +10s", len(got.Deliveries), got.Drained, got.NextDue)
	}
	d, err := l.Delivery(ctx, DeliveryID(ds[2].Seq))
	if err != nil || d.Status != StatusDead || len(d.History) != 1 || d.History[0].StatusCode != 500 || d.DeadAt == nil {
		t.Fatalf("dead delivery = %+v (%v)", d, err)
	}
	if n, err := l.Recover(ctx, "s", clock.Now()); err != nil || n != 1 {
		t.Fatalf("Recover = %d, %v; want 1", n, err)
	}
	if _, err := l.Requeue(ctx, DeliveryID(ds[0].Seq)); !errors.Is(err, ErrConflict) {
		t.Fatalf("requeue of a sent delivery = %v, want ErrConflict", err)
	}
}

func TestRestartReturnsInflightToPending(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(t0)
	path := filepath.Join(t.TempDir(), "r.db")
	l, err := Open(context.Background(), path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	l.Enqueue(ctx, []NewEvent{{ID: "x", Type: "t", Body: []byte(`{}`)}})
	if _, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: "s", Max: 1, Now: t0}}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, err = Open(context.Background(), path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ds, _, err := l.Deliveries(ctx, DeliveryFilter{Limit: 10})
	if err != nil || len(ds) != 1 || ds[0].Status != StatusPending {
		t.Fatalf("after restart: %+v (%v), want one pending delivery", ds, err)
	}
}

// The writer never checkpoints (its commits would stall behind the copy and
// its fsyncs); the checkpoint loop copies the WAL back into the database
// file on its own connection.
func TestCheckpointerCopiesTheWALBack(t *testing.T) {
	t.Parallel()
	l, _, path := open(t)
	addSubscriber(t, l, "s", "*")
	size := func() int64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	before := size()
	events := make([]NewEvent, 2000)
	for i := range events {
		events[i] = NewEvent{ID: fmt.Sprintf("e%d", i), Type: "t", Body: []byte(`{"padding":"` + strings.Repeat("x", 200) + `"}`)}
	}
	if _, err := l.Enqueue(context.Background(), events); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for size() < before+256<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("the database file is %d bytes (%d before 2,000 events): nothing was checkpointed", size(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TakeSetting reads a setting once: it is gone after.
func TestTakeSettingReadsOnce(t *testing.T) {
	t.Parallel()
	l, _, _ := open(t)
	ctx := context.Background()
	if err := l.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"v", ""} {
		if got, err := l.TakeSetting(ctx, "k"); err != nil || got != want {
			t.Errorf("take %d = %q, %v; want %q", i+1, got, err, want)
		}
	}
}

// A transaction left open on the writer connection (a ROLLBACK that
// failed) does not fail the next batch: it ends that transaction and
// commits.
func TestAWriteAfterATransactionLeftOpenCommits(t *testing.T) {
	t.Parallel()
	l, _, _ := open(t)
	ctx := context.Background()
	// Leave a transaction open the way a failed ROLLBACK would (the write
	// loop is idle: nothing else uses its connection now).
	if _, err := l.stmts.begin.ExecContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatalf("a write after a transaction was left open: %v", err)
	}
	if got, err := l.TakeSetting(ctx, "k"); err != nil || got != "v" {
		t.Fatalf("setting = %q, %v; want v", got, err)
	}
}

// Locks refused while the held file is linked onto their path and off it
// again, over and over, keep SQLite's locks on it whole, even once the
// garbage collector has run: a descriptor opened by a refusal is closed
// with the lock, never on its own.
func TestRefusalsRacingALinkKeepSQLitesLocks(t *testing.T) {
	t.Parallel()
	path, before := openWatched(t)
	other := filepath.Join(t.TempDir(), "other.db")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Link(path, other)
			os.Remove(other)
		}
	}()
	for range 2000 {
		if l, err := lockDatabaseFile(other); err == nil {
			l.release() // other was a file of its own at that moment
		}
	}
	close(stop)
	<-done
	runtime.GC()
	runtime.GC()
	if after := steadyLocks(t, path); after != before {
		t.Fatalf("SQLite's POSIX locks on the file: %d before the racing refusals, %d after", before, after)
	}
}

// An erase whose WAL a reader outside sluice keeps from being emptied says
// so, and leaves a mark: the next ScrubWAL, with the reader gone, empties
// it, and the file holds none of the value.
func TestAnEraseTheWALCannotFinishIsFinishedLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _, path := open(t)
	const secret = "erase-me-0123456789abcdef"
	if err := l.SetSetting(ctx, "credential", secret); err != nil {
		t.Fatal(err)
	}
	outside, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	reader, err := outside.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := reader.QueryRow(`SELECT count(*) FROM settings`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := l.EraseSetting(ctx, "credential"); !errors.Is(err, ErrScrubPending) {
		t.Fatalf("EraseSetting beside an outside reader = %v, want ErrScrubPending", err)
	}
	if v, _ := l.Setting(ctx, "credential"); v != "" {
		t.Fatalf("the erased setting still reads %q", v)
	}
	reader.Rollback()
	if err := l.ScrubWAL(ctx); err != nil {
		t.Fatalf("ScrubWAL once the reader left: %v", err)
	}
	if v, _ := l.Setting(ctx, scrubKey); v != "" {
		t.Errorf("the scrub mark is still there after the scrub")
	}
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s still holds the erased value", filepath.Base(f))
		}
	}
}

// Ping answers for the file, not only for a connection: it fails for a
// while after a write could not commit, whatever commits meanwhile, and
// when the file is no longer a database.
func TestPingAnswersForTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, clock, path := open(t)
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping of a fresh ledger: %v", err)
	}
	boom := errors.New("disk I/O error")
	if err := l.write(ctx, func(context.Context, *writer) error { return boom }); !errors.Is(err, boom) || !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("the failing write: %v; want ErrWriteFailed wrapping its cause", err)
	}
	if err := l.Ping(ctx); !errors.Is(err, boom) {
		t.Fatalf("Ping after a batch that could not commit = %v, want its error", err)
	}
	if _, err := l.Changes(ctx); err != nil { // a commit that writes nothing
		t.Fatal(err)
	}
	clock.Advance(writeFailedFor - time.Second)
	if err := l.Ping(ctx); !errors.Is(err, boom) {
		t.Fatalf("Ping %s after the failed write, an empty commit since = %v, want its error", writeFailedFor-time.Second, err)
	}
	clock.Advance(time.Second)
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping %s after the failed write: %v", writeFailedFor, err)
	}
	for _, f := range []string{path, path + "-wal"} {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Ping(ctx); err == nil {
		t.Fatal("Ping of a file truncated to nothing succeeded")
	}
}

// A path given in any of its spellings opens the database: relative with
// "./" (the default, ./data/sluice.db), with doubled or dotted parts, or
// through a symlinked folder. Each names one file, whose lock the ledger
// must not meet as someone else's.
func TestAnyPathToTheFileOpensIt(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "via")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, p := range []string{
		"./data/sluice.db",
		filepath.Join(dir, "data") + "//twice.db",
		filepath.Join(dir, "data") + "/../data/./dots.db",
		filepath.Join(dir, "via", "linked.db"),
		"via/../via/./mixed.db",
	} {
		l, err := Open(context.Background(), p, Options{})
		if err != nil {
			t.Errorf("Open(%q): %v", p, err)
			continue
		}
		l.Close()
		if _, err := Migrate(context.Background(), p, t0); err != nil {
			t.Errorf("Migrate(%q): %v", p, err)
		}
	}
}

// A file that is not a SQLite database is refused as it is: not made
// private, not given a lock file beside it.
func TestAFileThatIsNoDatabaseIsLeftAlone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(path, []byte("hello, not a database\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), path, Options{}); err == nil || !strings.Contains(err.Error(), "not a SQLite database") {
		t.Errorf("Open = %v, want an error saying it is not a SQLite database", err)
	}
	if _, err := Migrate(context.Background(), path, t0); err == nil || !strings.Contains(err.Error(), "not a SQLite database") {
		t.Errorf("Migrate = %v, want an error saying it is not a SQLite database", err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the refused file: %v, %v; want its mode -rw-r--r-- kept", st.Mode().Perm(), err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "hello, not a database\n" {
		t.Errorf("the refused file now holds %q (%v)", b, err)
	}
	if _, err := os.Stat(path + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a lock file was left beside the refused file (%v)", err)
	}
}

// An outcome recorded after its subscriber was removed and created again
// under the same id is of the old one's delivery, whose row went with it:
// it leaves no attempt row behind and is not counted in the new one's stats.
func TestAnOutcomeOfARemovedSubscribersDeliveryIsNotRecorded(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "again", "*")
	if _, err := l.Enqueue(ctx, []NewEvent{{ID: "e1", Type: "t", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	res, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: "again", Max: 1, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil || len(res[0].Deliveries) != 1 {
		t.Fatalf("claim = %+v, %v; want the one delivery", res, err)
	}
	old := res[0].Deliveries[0]
	if err := l.DeleteSubscriber(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	addSubscriber(t, l, "again", "*")
	err = l.Record(ctx, []Result{{Seq: old.Seq, SubscriberID: "again", Status: StatusDead,
		Attempt: &Attempt{Number: 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: 500}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := l.rdb.QueryRowContext(ctx, `SELECT count(*) FROM attempts`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d attempt rows (%v), want none: the delivery is gone", n, err)
	}
	stats, err := l.Stats(ctx, clock.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if st := stats["again"]; st != nil && st.Attempts != 0 {
		t.Errorf("the new subscriber's stats count %d attempts, want none", st.Attempts)
	}
	// Its own deliveries are recorded as ever.
	if _, err := l.Enqueue(ctx, []NewEvent{{ID: "e2", Type: "t", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	res, err = l.Claim(ctx, []ClaimRequest{{SubscriberID: "again", Max: 1, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil || len(res[0].Deliveries) != 1 {
		t.Fatalf("claim = %+v, %v; want the new delivery", res, err)
	}
	err = l.Record(ctx, []Result{{Seq: res[0].Deliveries[0].Seq, SubscriberID: "again", Status: StatusSent,
		Attempt: &Attempt{Number: 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: 200}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(countsTTL) // past the shared count
	if stats, err = l.Stats(ctx, clock.Now().Add(-time.Minute)); err != nil || stats["again"] == nil || stats["again"].Sent != 1 {
		t.Errorf("the new subscriber's own delivery: stats %+v (%v), want 1 sent", stats["again"], err)
	}
}

// A batch that rolls back takes its bornAfter marks back with it: a
// re-create that never committed must not leave the subscriber still there
// skipping its own outcomes.
func TestARolledBackBatchTakesItsBornAfterBack(t *testing.T) {
	t.Parallel()
	l, _, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "x", "*")
	before, had := l.bornAfter["x"]
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		l.setBornAfter(w, "x", 0, false) // as a delete does
		l.setBornAfter(w, "x", 99, true) // then a create
		return errors.New("disk I/O error")
	})
	if err == nil {
		t.Fatal("the failing batch committed")
	}
	if after, has := l.bornAfter["x"]; has != had || after != before {
		t.Fatalf("bornAfter[x] after the rollback = %d (%v), want %d (%v) as before", after, has, before, had)
	}
}

// A database file deleted or replaced under the running ledger still
// answers through the handles held on it, and would take writes that the
// next start does not find; Ping must say so, and writes must fail.
func TestPingAndWritesFailWhenTheFileLeavesItsPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, move := range map[string]func(path string) error{
		"deleted": os.Remove,
		"replaced": func(path string) error {
			if err := os.Rename(path, path+".old"); err != nil {
				return err
			}
			return os.WriteFile(path, []byte(sqliteHeader), 0o600)
		},
	} {
		l, _, path := open(t)
		if err := l.Ping(ctx); err != nil {
			t.Fatalf("%s: Ping before: %v", name, err)
		}
		if err := move(path); err != nil {
			t.Fatal(err)
		}
		if err := l.Ping(ctx); err == nil || !strings.Contains(err.Error(), "no longer at its path") {
			t.Errorf("%s: Ping = %v; want the file named gone", name, err)
		}
		_, err := l.Enqueue(ctx, []NewEvent{{ID: "after", Type: "t", Body: []byte(`{"type":"t"}`)}})
		if !errors.Is(err, ErrWriteFailed) || !strings.Contains(err.Error(), "no longer at its path") {
			t.Errorf("%s: Enqueue = %v; want a failed write that names the file gone", name, err)
		}
	}
	// A path that can no longer be looked up is told as that, not as a
	// deleted file: here its folder was moved and a file put in its place.
	l, _, path := open(t)
	dir := filepath.Dir(path)
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := l.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "cannot be looked up at its path: not a directory") || strings.Contains(err.Error(), dir) {
		t.Errorf("folder replaced by a file: Ping = %v; want the lookup's own fault, without the path", err)
	}
}

// Another program's SQLite database is refused before anything changes
// it: its mode, its journal mode and its tables stay as they were.
func TestOpenLeavesAForeignDatabaseAsItWas(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "theirs.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), path, Options{}); !errors.Is(err, migrations.ErrForeign) {
		t.Fatalf("Open = %v; want ErrForeign", err)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 || !bytes.Equal(before, after) {
		t.Errorf("the refused file changed: mode %v, content the same %v", st.Mode().Perm(), bytes.Equal(before, after))
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		t.Error("the refused file was put in WAL mode")
	}
	if _, err := os.Stat(path + ".lock"); err == nil {
		t.Error("the refusal left a .lock file beside it")
	}
}

// A subscriber's counts add up to its deliveries, even when they are read
// from the shared count while deliveries move from in flight to sent.
func TestStatsCountsAddUp(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	sent := sixWithFourToSend(t, l, clock)
	sum := func() int {
		st, err := l.Stats(ctx, clock.Now().Add(-5*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		s := st["s"]
		return s.Pending + s.Inflight + s.Sent + s.Dead
	}
	if n := sum(); n != 6 {
		t.Fatalf("counts add up to %d, want 6", n)
	}
	if err := l.Record(ctx, sent, nil); err != nil {
		t.Fatal(err)
	}
	if n := sum(); n != 6 { // within countsTTL of the first count
		t.Fatalf("after 4 were sent the counts add up to %d, want 6", n)
	}
}

// Counts that start while a batch marking deliveries sent is still open
// see neither its rows nor its totals: the sent totals move with the
// commit, not when the batch's ops run.
func TestStatsCountsDuringACommitAddUp(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	sent := sixWithFourToSend(t, l, clock)
	queued := func(n int) { waitQueued(t, l, n) }
	// Hold the write loop, queue the sent marks and an op behind them, and
	// let the batch run up to that op: the marks have run, the batch has
	// not committed.
	openGate := holdWriteLoop(l)
	recorded := make(chan error, 1)
	go func() { recorded <- l.Record(ctx, sent, nil) }()
	queued(1)
	commitGate, inLast := make(chan struct{}), make(chan struct{})
	go l.write(ctx, func(context.Context, *writer) error { close(inLast); <-commitGate; return nil })
	queued(2)
	close(openGate)
	<-inLast
	clock.Advance(countsTTL) // a fresh count, not the shared one
	st, err := l.Counts(ctx)
	close(commitGate)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
	if s := st["s"]; s.Pending+s.Inflight+s.Sent+s.Dead != 6 {
		t.Errorf("counts during the commit %+v add up to %d, want 6", *s, s.Pending+s.Inflight+s.Sent+s.Dead)
	}
}

// A path with characters a file: URI reads as its own opens the file of
// that name, the one the lock is on: not "a" for "a#b.db".
func TestAPathWithURICharactersOpensThatFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"a#b.db", "c?mode=ro.db", "e%41f.db", "//twice.db"} {
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, "//") {
			path = "/" + dir + name // "//tmp/…//twice.db": a URI would read an authority
		}
		l, err := Open(context.Background(), path, Options{})
		if err != nil {
			t.Errorf("Open(%q): %v", name, err)
			continue
		}
		addSubscriber(t, l, "s", "*")
		l.Close()
		db, err := sql.Open("sqlite", "file:"+uriPath(path)+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = db.QueryRow(`SELECT count(*) FROM subscribers`).Scan(&n)
		db.Close()
		if err != nil || n != 1 {
			t.Errorf("%s holds %d subscribers (%v), want the one added", name, n, err)
		}
	}
	for _, stray := range []string{"a", "c", "eAf.db"} {
		if _, err := os.Stat(filepath.Join(dir, stray)); err == nil {
			t.Errorf("a file %q was made beside the ones asked for", stray)
		}
	}
}

// waitQueued waits until n ops wait for the write loop.
func waitQueued(t *testing.T, l *Ledger, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(l.ops) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d ops queued, want %d", len(l.ops), n)
		}
		runtime.Gosched()
	}
}

// A count that starts while a removal's batch is finishing (committed,
// running its after-commit steps) must not stop the write loop: the
// removal's steps take the count's lock, and the count waits on them.
func TestACountBesideARemovalFinishes(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	openGate := holdWriteLoop(l)
	afterGate, inAfter := make(chan struct{}), make(chan struct{})
	go l.write(ctx, func(_ context.Context, w *writer) error {
		w.after = append(w.after, func() { close(inAfter); <-afterGate })
		return nil
	})
	waitQueued(t, l, 1)
	deleted := make(chan error, 1)
	go func() { deleted <- l.DeleteSubscriber(ctx, "s") }()
	waitQueued(t, l, 2)
	close(openGate)
	<-inAfter // committed; the removal's own steps come next
	clock.Advance(countsTTL)
	counted := make(chan error, 1)
	go func() { _, err := l.Counts(ctx); counted <- err }()
	time.Sleep(100 * time.Millisecond) // give the count the time to reach the commit's lock
	close(afterGate)
	for name, done := range map[string]chan error{"the removal": deleted, "the count": counted} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never finished: the write loop and the count wait on each other", name)
		}
	}
}

// A recount of stale sent totals that shares a batch with sent marks, and
// comes after them, counts them once: not in its count and again when the
// marks are added after the commit.
func TestARecountBesideSentMarksCountsThemOnce(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	sent := sixWithFourToSend(t, l, clock)
	l.staleSent() // as after a batch that rolled back
	openGate := holdWriteLoop(l)
	recorded := make(chan error, 1)
	go func() { recorded <- l.Record(ctx, sent, nil) }()
	waitQueued(t, l, 1)
	counted := make(chan error, 1)
	go func() { _, err := l.Counts(ctx); counted <- err }() // queues the recount behind the marks
	waitQueued(t, l, 2)
	close(openGate)
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
	if err := <-counted; err != nil {
		t.Fatal(err)
	}
	clock.Advance(countsTTL)
	st, err := l.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := st["s"]; s.Sent != 4 || s.Pending+s.Inflight+s.Sent+s.Dead != 6 {
		t.Errorf("after 4 sent: %+v, adding up to %d; want 4 sent and 6 in all", *s, s.Pending+s.Inflight+s.Sent+s.Dead)
	}
}

// A count that starts after a batch has committed sent marks, but before
// the totals have moved with them, waits for the totals: it must not see
// the rows sent and the totals not yet.
func TestACountBetweenACommitAndItsTotalsWaits(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	sent := sixWithFourToSend(t, l, clock)
	openGate := holdWriteLoop(l)
	// The next batch: an op whose after-commit step holds, then the marks.
	afterGate, inAfter := make(chan struct{}), make(chan struct{})
	go l.write(ctx, func(_ context.Context, w *writer) error {
		w.after = append(w.after, func() { close(inAfter); <-afterGate })
		return nil
	})
	waitQueued(t, l, 1)
	recorded := make(chan error, 1)
	go func() { recorded <- l.Record(ctx, sent, nil) }()
	waitQueued(t, l, 2)
	close(openGate)
	<-inAfter // committed: the rows are sent, the totals not yet moved
	clock.Advance(countsTTL)
	counted := make(chan map[string]*SubscriberStats, 1)
	go func() {
		st, err := l.Counts(ctx)
		if err != nil {
			t.Error(err)
		}
		counted <- st
	}()
	time.Sleep(100 * time.Millisecond) // give the count the time to read, were it not held
	close(afterGate)
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
	st := <-counted
	if s := st["s"]; s == nil || s.Pending+s.Inflight+s.Sent+s.Dead != 6 {
		t.Errorf("a count between the commit and its totals: %+v; want 6 in all", s)
	}
}

// A --db path through a symlinked folder and ".." names the file the
// kernel resolves, for SQLite as for the lock: read as text, "link/.."
// would be another folder.
func TestAPathThroughALinkAndDotDotIsTheLockedFile(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for _, d := range []string{filepath.Join(base, "real", "sub"), filepath.Join(base, "work")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(base, "real", "sub"), filepath.Join(base, "work", "link")); err != nil {
		t.Fatal(err)
	}
	l, err := Open(context.Background(), filepath.Join(base, "work", "link")+"/../x.db", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addSubscriber(t, l, "s", "*")
	if err := l.Ping(context.Background()); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "work", "x.db")); err == nil {
		t.Error("SQLite wrote work/x.db, beside the link, not the locked real/x.db")
	}
	if st, err := os.Stat(filepath.Join(base, "real", "x.db")); err != nil || st.Size() == 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("real/x.db: %v, %v; want the ledger, its owner's alone", st, err)
	}
}

// Counts at once over stale totals share one count: one recount in the
// write loop, not one each.
func TestConcurrentCountsShareOneCount(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	clock.Advance(countsTTL)
	l.staleSent()
	openGate := holdWriteLoop(l)
	done := make(chan error, 3)
	for range 3 {
		go func() { _, err := l.Counts(ctx); done <- err }()
	}
	waitQueued(t, l, 1)
	time.Sleep(100 * time.Millisecond) // give the others the time to queue theirs, were they to
	if n := len(l.ops); n != 1 {
		t.Errorf("%d recounts queued for 3 concurrent counts, want 1", n)
	}
	close(openGate)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// sixWithFourToSend gives subscriber "s" (for every type) six deliveries,
// claims four, and returns the results that mark those four sent.
func sixWithFourToSend(t *testing.T, l *Ledger, clock *fakeclock.Clock) []Result {
	t.Helper()
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	for i := range 6 {
		if _, err := l.Enqueue(ctx, []NewEvent{{ID: fmt.Sprintf("e%d", i), Type: "t", Body: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: "s", Max: 4, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	var sent []Result
	for _, c := range res[0].Deliveries {
		sent = append(sent, Result{Seq: c.Seq, SubscriberID: "s", Status: StatusSent,
			Attempt: &Attempt{Number: 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: 200}})
	}
	return sent
}

// holdWriteLoop holds the write loop in a batch of one op until the
// returned channel closes, so the ops queued meanwhile make the next batch.
func holdWriteLoop(l *Ledger) chan struct{} {
	release, in := make(chan struct{}), make(chan struct{})
	go l.write(context.Background(), func(context.Context, *writer) error { close(in); <-release; return nil })
	<-in
	return release
}

// Open puts back to pending what a process left in flight and says how
// many, so serve can tell the operator those may arrive twice.
func TestOpenCountsTheDeliveriesItTakesBack(t *testing.T) {
	t.Parallel()
	l, clock, path := open(t)
	sixWithFourToSend(t, l, clock) // four claimed, none recorded
	if n := l.Released(); n != 0 {
		t.Fatalf("a fresh ledger took back %d", n)
	}
	l.Close()
	again, err := Open(context.Background(), path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if n := again.Released(); n != 4 {
		t.Errorf("Released = %d after a stop with four in flight, want 4", n)
	}
}

// A lock released while another goroutine forks a child stays held by the
// child's copy of the descriptor until it execs: taking it again at that
// moment must wait for the exec, not refuse the file as in use.
func TestALockReleasedBesideAForkIsTakenAgain(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sluice.db")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = exec.Command(bin).Run()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for i := range 200 {
		l, err := lockDatabaseFile(path)
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
		l.release()
	}
}
