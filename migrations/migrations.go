// Package migrations holds the ledger's schema as numbered SQL files embedded
// in the binary, and applies each once, in order, recording it in the database.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, name := range names {
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: name must start with a positive number and '_'", name)
		}
		body, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// Apply runs every migration db has not recorded yet, each in its own
// transaction with its record, and returns the names it applied.
func Apply(ctx context.Context, db *sql.DB, now time.Time) ([]string, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	if err := CheckOwner(ctx, db); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	if err := checkKnown(ctx, db, all); err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range all {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return applied, err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&n); err != nil {
			tx.Rollback()
			return applied, err
		}
		if n > 0 {
			tx.Rollback()
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return applied, fmt.Errorf("migration %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.Version, m.Name, now.UnixMilli()); err != nil {
			tx.Rollback()
			return applied, err
		}
		if err := tx.Commit(); err != nil {
			return applied, fmt.Errorf("migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Name)
	}
	return applied, nil
}

// CheckOwner refuses a database sluice did not make: one that holds tables
// but no schema_migrations of sluice's shape (golang-migrate, Rails and
// dbmate name their table the same), where the first migration would fail
// halfway through someone else's schema. It only reads.
func CheckOwner(ctx context.Context, db *sql.DB) error {
	cols := map[string]bool{}
	rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info('schema_migrations')`)
	if err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return fmt.Errorf("read the schema: %w", err)
		}
		cols[c] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	if len(cols) > 0 {
		if cols["version"] && cols["name"] && cols["applied_at"] {
			return nil
		}
		return fmt.Errorf("%w: its schema_migrations is another tool's; choose another --db", ErrForeign)
	}
	var other string
	err = db.QueryRowContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name LIMIT 1`).Scan(&other)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read the schema: %w", err)
	}
	return fmt.Errorf("%w: it holds tables (%q among them) but no schema_migrations; choose another --db", ErrForeign, printable(other))
}

// checkKnown refuses a database that records a migration this binary does
// not have: a newer sluice migrated it, and this one would run on a schema
// it does not understand.
func checkKnown(ctx context.Context, db *sql.DB, all []Migration) error {
	known := make(map[int]string, len(all))
	for _, m := range all {
		known[m.Version] = m.Name
	}
	rows, err := db.QueryContext(ctx, `SELECT version, name FROM schema_migrations ORDER BY version`)
	if err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		if known[v] != name {
			return fmt.Errorf("%w: it records migration %d (%q), which this sluice does not have; run the sluice that migrated it",
				ErrUnknown, v, printable(name))
		}
	}
	return rows.Err()
}

// ErrForeign and ErrUnknown say why a database was refused before any
// migration ran.
var (
	ErrForeign = errors.New("the database was not made by sluice")
	ErrUnknown = errors.New("the database was migrated by another sluice")
)

// printable cuts a name read from the file to something safe to print.
func printable(s string) string {
	const most = 64
	if len(s) > most {
		s = s[:most]
	}
	return strings.ToValidUTF8(s, "?")
}
