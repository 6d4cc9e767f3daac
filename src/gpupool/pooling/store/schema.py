"""The SQLite schema, created idempotently on open.

Leases keep their slices in a table of their own (not a JSON column) so the
allocation per device is one indexed SUM instead of decoding every lease.
"""

SCHEMA_VERSION = 5  # 3: queues, lease history, queue/priority/preemption columns; 4: suspensions (and
# lease_history.suspended_s); 5: tickets.held, lease_history.exit_code
# Where a token came from (tokens.origin). A token of version 1 has none recorded
# ("legacy"): it may have been minted by a server running without auth, so an
# authenticating server does not honour it (see server/auth.py).
TOKEN_ORIGINS = ("api", "local", "secret", "legacy")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    uuid       TEXT PRIMARY KEY,
    idx        INTEGER NOT NULL,
    name       TEXT NOT NULL,
    memory_mib INTEGER NOT NULL,
    node       TEXT NOT NULL,
    healthy    INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS leases (
    id          TEXT PRIMARY KEY,
    holder_name TEXT NOT NULL,
    holder      TEXT NOT NULL,      -- Holder.to_dict() as JSON
    ttl_s       REAL NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    queue       TEXT NOT NULL DEFAULT '',
    priority    INTEGER NOT NULL DEFAULT 0,
    preempt_grace_s REAL NOT NULL DEFAULT 30.0,
    preempted_at REAL,                  -- NULL until the pool tells its holder to stop
    claim_key   TEXT NOT NULL DEFAULT '',  -- the client's key of the claim it answers ('' = none)
    idle_suspend_s REAL                 -- its claim's idle limit; NULL: the pool's rule
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases (expires_at);
CREATE TABLE IF NOT EXISTS slices (
    lease_id    TEXT NOT NULL REFERENCES leases (id) ON DELETE CASCADE,
    device_uuid TEXT NOT NULL,
    memory_mib  INTEGER NOT NULL,
    grp         INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS slices_by_lease ON slices (lease_id);
-- covering index: the allocation SUM never touches the table
CREATE INDEX IF NOT EXISTS slices_by_device ON slices (device_uuid, memory_mib);
-- a lease that is not simply running (core/suspension.py): one row while it suspends, is
-- suspended or resumes, kept after it runs again for its suspended seconds and last error
CREATE TABLE IF NOT EXISTS suspensions (
    lease_id    TEXT PRIMARY KEY REFERENCES leases (id) ON DELETE CASCADE,
    state       TEXT NOT NULL,
    record      TEXT NOT NULL       -- Suspension.to_dict() as JSON
);
CREATE TABLE IF NOT EXISTS tickets (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the FIFO order
    claim       TEXT NOT NULL,      -- Claim.to_dict() as JSON, for status and debugging
    holder      TEXT NOT NULL,
    host        TEXT NOT NULL,      -- host and pid of the waiting process, to drop dead waiters
    pid         INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,      -- refreshed by the waiter while it polls
    queue       TEXT NOT NULL DEFAULT '',
    priority    INTEGER NOT NULL DEFAULT 0,
    claim_key   TEXT NOT NULL DEFAULT '',  -- the client's key of the claim, to re-attach after a restart
    reason      TEXT NOT NULL DEFAULT '',  -- why it waits, as the pool last told it
    held        INTEGER NOT NULL DEFAULT 0 -- 1: kept in the queue but skipped by grants (gpupool claim hold)
);
-- A suspended lease waiting for room holds a ticket named only inside its record: when the record
-- goes (with its lease, by the cascade), the ticket goes too, instead of holding later claims back
-- until it expires.
CREATE TRIGGER IF NOT EXISTS suspension_gone_drops_its_ticket AFTER DELETE ON suspensions
BEGIN
    DELETE FROM tickets WHERE id = json_extract(OLD.record, '$.ticket');
END;
CREATE TABLE IF NOT EXISTS tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,  -- sha256 hex of the token; the token itself is never stored
    admin      INTEGER NOT NULL,
    created_at REAL NOT NULL,
    origin     TEXT NOT NULL DEFAULT 'legacy',  -- api (an admin token over HTTP), local (--state), secret (node agent)
    queue      TEXT NOT NULL DEFAULT '',        -- '' = may claim in any queue
    last_used  REAL                             -- when it last authenticated (to the minute); NULL: never
);
CREATE TABLE IF NOT EXISTS queues (
    name       TEXT PRIMARY KEY,
    quota      REAL NOT NULL,       -- GPUs guaranteed
    weight     REAL NOT NULL,       -- share of idle GPUs lent
    limit_gpus REAL,                -- NULL: no cap
    preempt    TEXT NOT NULL DEFAULT '',  -- what preempting its borrowers does; '' = the pool's default
    idle_suspend_s REAL,                 -- its leases' idle limit; NULL: the node's
    default_time_s REAL,                 -- its runs' wall-time limit without --time; NULL: none
    max_time_s     REAL                  -- the most --time it allows; NULL: no maximum
);
-- one row per lease that ended, written in the transaction that ended it: usage accounting.
-- No index: one would cost every release another page written; `gpupool usage` scans instead.
CREATE TABLE IF NOT EXISTS lease_history (
    lease_id     TEXT NOT NULL,
    queue        TEXT NOT NULL,
    holder_name  TEXT NOT NULL,
    label        TEXT NOT NULL,
    gpus         REAL NOT NULL,     -- size in GPUs: sum of slice MiB / device MiB
    started_at   REAL NOT NULL,
    ended_at     REAL NOT NULL,
    reason       TEXT NOT NULL,     -- HISTORY_REASONS
    preempted_at REAL,
    suspended_s  REAL NOT NULL DEFAULT 0,  -- seconds of [started_at, ended_at] it was suspended: not GPU time
    exit_code    INTEGER,                  -- its command's exit code, as its runner said at release; NULL: none said
    ended_by     TEXT NOT NULL DEFAULT '', -- who ended it: its owner or an admin (core.suspension's BY_OWNER,
                                           -- BY_ADMIN); '' = nobody (an expiry) or not recorded (an older row)
    preempt_mode TEXT NOT NULL DEFAULT ''  -- how it was last preempted (core.suspension.PREEMPT_MODES); '' = never
);
-- every preemption, counted by the victim's queue and the mode applied (suspend, requeue, kill), in
-- the transaction that decides it: a suspended victim runs on as the same lease, so no lease row
-- tells it apart, and the history is pruned. Made on open, as samples: no version bump.
CREATE TABLE IF NOT EXISTS preemptions (
    queue TEXT NOT NULL,
    mode  TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (queue, mode)
);
-- the pool over time for the dashboard's long ranges (store/samples.py): one row per minute at
-- most, the oldest dropped past the retention. A table of its own, made on open: no version bump,
-- as an older gpupool opens the state dir as before (it never reads this table).
CREATE TABLE IF NOT EXISTS samples (
    minute        INTEGER PRIMARY KEY,  -- the start of the minute, epoch seconds
    at            REAL NOT NULL,        -- when it was taken
    total_mib     INTEGER NOT NULL,
    allocated_mib INTEGER NOT NULL,
    used_mib      INTEGER,              -- NULL: usage not sampled
    leases        INTEGER NOT NULL,
    queued        INTEGER NOT NULL
);
"""

# Why a lease ended (lease_history.reason): its holder (or an admin) released it, no heartbeat came
# within its TTL, the pool reaped it after a preemption its runner did not act on, or the token it
# was claimed with was revoked.
HISTORY_REASONS = ("released", "expired", "preempted", "revoked", "timeout")

# Columns added after schema 1, with their declarations: an older database gets them by
# ALTER TABLE on open (idempotent: only the missing ones), a new one from SCHEMA above.
ADDED_COLUMNS = {
    "tokens": (
        ("origin", "TEXT NOT NULL DEFAULT 'legacy'"),
        ("queue", "TEXT NOT NULL DEFAULT ''"),
        ("last_used", "REAL"),
    ),
    "leases": (
        ("queue", "TEXT NOT NULL DEFAULT ''"),
        ("priority", "INTEGER NOT NULL DEFAULT 0"),
        ("preempt_grace_s", "REAL NOT NULL DEFAULT 30.0"),
        ("preempted_at", "REAL"),
        ("claim_key", "TEXT NOT NULL DEFAULT ''"),
        ("idle_suspend_s", "REAL"),
    ),
    "queues": (
        ("preempt", "TEXT NOT NULL DEFAULT ''"),
        ("idle_suspend_s", "REAL"),
        ("default_time_s", "REAL"),
        ("max_time_s", "REAL"),
    ),
    "lease_history": (
        ("suspended_s", "REAL NOT NULL DEFAULT 0"),
        ("exit_code", "INTEGER"),
        # No schema version of its own: an older gpupool names the columns it writes, and reads
        # none it does not know, so it opens a state dir with this column as before.
        ("ended_by", "TEXT NOT NULL DEFAULT ''"),
        ("preempt_mode", "TEXT NOT NULL DEFAULT ''"),
    ),
    "tickets": (
        ("queue", "TEXT NOT NULL DEFAULT ''"),
        ("priority", "INTEGER NOT NULL DEFAULT 0"),
        ("claim_key", "TEXT NOT NULL DEFAULT ''"),
        ("reason", "TEXT NOT NULL DEFAULT ''"),
        ("held", "INTEGER NOT NULL DEFAULT 0"),
    ),
}

# The index a retried claim finds its lease by (Tx.lease_by_key). Made by a server's start
# (pool/renewal.py), not with the tables: an older database has the column only after the ALTERs
# of ADDED_COLUMNS, and the embedded pool sends no keys; claims without a key add no entry.
KEY_INDEX = "CREATE INDEX IF NOT EXISTS leases_by_key ON leases (claim_key) WHERE claim_key != ''"
