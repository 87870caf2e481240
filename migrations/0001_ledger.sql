-- The delivery ledger. Times are Unix milliseconds unless a column says otherwise.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE subscribers (
    id                TEXT PRIMARY KEY,
    url               TEXT NOT NULL,
    event_types       TEXT NOT NULL,               -- JSON array of patterns
    rate_per_second   REAL NOT NULL,
    rate_burst        REAL NOT NULL,
    edge_share        REAL NOT NULL DEFAULT 0.5,
    max_attempts      INTEGER NOT NULL,
    timeout_ms        INTEGER NOT NULL,
    secret            TEXT NOT NULL,
    previous_secret   TEXT NOT NULL DEFAULT '',
    previous_until    INTEGER NOT NULL DEFAULT 0,
    paused            INTEGER NOT NULL DEFAULT 0,  -- paused by the operator
    paused_until      INTEGER NOT NULL DEFAULT 0,  -- paused by the subscriber's Retry-After
    breaker_state     TEXT NOT NULL DEFAULT 'closed',
    breaker_failures  INTEGER NOT NULL DEFAULT 0,
    breaker_opened_at INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE TABLE events (
    seq        INTEGER PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    type       TEXT NOT NULL,
    body       BLOB NOT NULL,
    created_at INTEGER NOT NULL
);

-- A delivery's public id is "dlv_" followed by its seq.
CREATE TABLE deliveries (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    subscriber_id   TEXT NOT NULL,
    event_seq       INTEGER NOT NULL,
    status          TEXT NOT NULL,                 -- pending | inflight | sent | dead
    attempts        INTEGER NOT NULL DEFAULT 0,    -- every attempt ever made; numbers the history
    budget_from     INTEGER NOT NULL DEFAULT 0,    -- attempts made before the last requeue
    deferrals       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    lease_until     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    sent_at         INTEGER,
    dead_at         INTEGER,
    last_error      TEXT NOT NULL DEFAULT '',
    UNIQUE (event_seq, subscriber_id)              -- idempotent enqueue; also the event's deliveries
);

-- Claims read only due work of one subscriber; sent and dead rows leave the index.
CREATE INDEX deliveries_due ON deliveries (subscriber_id, next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_inflight ON deliveries (subscriber_id) WHERE status = 'inflight';
CREATE INDEX deliveries_dead ON deliveries (subscriber_id, dead_at) WHERE status = 'dead';
CREATE INDEX deliveries_sent ON deliveries (sent_at) WHERE status = 'sent';
CREATE INDEX deliveries_subscriber ON deliveries (subscriber_id, seq);

CREATE TABLE attempts (
    delivery_seq   INTEGER NOT NULL,
    number         INTEGER NOT NULL,
    subscriber_id  TEXT NOT NULL,
    at             INTEGER NOT NULL,
    lane           TEXT NOT NULL,
    status_code    INTEGER NOT NULL,               -- 0 when no answer came
    error          TEXT NOT NULL DEFAULT '',
    duration_ms    INTEGER NOT NULL,
    retry_after_ms INTEGER,
    response       TEXT NOT NULL DEFAULT '',       -- the first bytes of the answer
    PRIMARY KEY (delivery_seq, number)
) WITHOUT ROWID;

CREATE INDEX attempts_at ON attempts (at);
