package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sluice-dev/sluice/migrations"
)

func open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func tables(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	return strings.Join(names, ",")
}

func TestApplyRunsEachMigrationOnce(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	first, err := migrations.Apply(ctx, db, time.Unix(0, 0))
	if err != nil || len(first) != len(all) {
		t.Fatalf("first Apply = %v, %v; want all %d", first, err, len(all))
	}
	again, err := migrations.Apply(ctx, db, time.Unix(0, 0))
	if err != nil || len(again) != 0 {
		t.Fatalf("second Apply = %v, %v; want nothing to do", again, err)
	}
}

// A database a newer sluice migrated records a migration this one lacks;
// running on it would mean running on a schema this binary does not know.
func TestApplyRefusesAMigrationItDoesNotKnow(t *testing.T) {
	ctx := context.Background()
	for name, record := range map[string]string{
		"a later version":         `INSERT INTO schema_migrations VALUES (9999, '9999_future.sql', 0)`,
		"a known version renamed": `UPDATE schema_migrations SET name = '0001_other.sql' WHERE version = 1`,
	} {
		t.Run(name, func(t *testing.T) {
			db := open(t)
			if _, err := migrations.Apply(ctx, db, time.Unix(0, 0)); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(record); err != nil {
				t.Fatal(err)
			}
			applied, err := migrations.Apply(ctx, db, time.Unix(0, 0))
			if !errors.Is(err, migrations.ErrUnknown) || len(applied) != 0 {
				t.Fatalf("Apply = %v, %v; want ErrUnknown and nothing applied", applied, err)
			}
		})
	}
}

// Another program's SQLite file is refused before sluice writes to it,
// including one whose migrations table has the same name as sluice's.
func TestApplyLeavesAForeignDatabaseAlone(t *testing.T) {
	ctx := context.Background()
	for schema, want := range map[string]string{
		`CREATE TABLE subscribers (x INTEGER)`:                                       `"subscribers"`,
		`CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN)`: "another tool's",
	} {
		db := open(t)
		if _, err := db.Exec(schema); err != nil {
			t.Fatal(err)
		}
		before := tables(t, db)
		_, err := migrations.Apply(ctx, db, time.Unix(0, 0))
		if !errors.Is(err, migrations.ErrForeign) || !strings.Contains(err.Error(), want) {
			t.Errorf("Apply over %s = %v; want ErrForeign saying %s", schema, err, want)
		}
		if got := tables(t, db); got != before {
			t.Errorf("tables after the refusal: %s; want %s alone", got, before)
		}
	}
}
