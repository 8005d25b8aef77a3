-- stead's durable state (DESIGN §5), SQLite flavour.
--
-- Timestamps are integer microseconds since the Unix epoch (`*_us`), durations
-- integer milliseconds (`*_ms`): integers round-trip exactly and compare
-- correctly. Constraints are named the same in both backends so operators
-- (and tests) can refer to them.

CREATE TABLE instances (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    name                TEXT    NOT NULL CONSTRAINT instances_name_unique UNIQUE,
    team                TEXT    NOT NULL,
    service_type        TEXT    NOT NULL,
    version             TEXT    NOT NULL,
    state               TEXT    NOT NULL CONSTRAINT instances_state_check
        CHECK (state IN ('provisioning', 'ready', 'upgrading', 'deleting', 'deleted', 'failed')),
    stopped             INTEGER NOT NULL DEFAULT 0 CONSTRAINT instances_stopped_check
        CHECK (stopped IN (0, 1)),
    expires_at_us       INTEGER,
    maintenance_window  TEXT,
    created_at_us       INTEGER NOT NULL,
    updated_at_us       INTEGER NOT NULL
);

-- ACTIVE: the generation each service serves now.
CREATE TABLE active_services (
    instance_id            INTEGER NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    service                TEXT    NOT NULL,
    container_id           TEXT    NOT NULL,
    effective_revision     TEXT    NOT NULL,
    -- JSON object: container port -> loopback host port.
    backend_binds          TEXT    NOT NULL DEFAULT '{}',
    stop_grace_ms          INTEGER CONSTRAINT active_services_stop_grace_check CHECK (stop_grace_ms >= 0),
    verified_started_at_us INTEGER,
    PRIMARY KEY (instance_id, service)
);

CREATE TABLE inhibitions (
    instance_id    INTEGER NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    service        TEXT    NOT NULL,
    container_id   TEXT    NOT NULL,
    reason         TEXT    NOT NULL,
    operation      TEXT    NOT NULL,
    created_at_us  INTEGER NOT NULL,
    stop_grace_ms  INTEGER CONSTRAINT inhibitions_stop_grace_check CHECK (stop_grace_ms >= 0),
    PRIMARY KEY (instance_id, service, container_id)
);

CREATE TABLE tasks (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    kind           TEXT    NOT NULL CONSTRAINT tasks_kind_check
        CHECK (kind IN ('provision', 'reprovision', 'upgrade', 'deprovision')),
    instance_id    INTEGER NOT NULL REFERENCES instances (id),
    state          TEXT    NOT NULL CONSTRAINT tasks_state_check
        CHECK (state IN ('queued', 'running', 'done', 'failed')),
    run_after_us   INTEGER NOT NULL,
    locked_by      TEXT,
    locked_at_us   INTEGER,
    attempts       INTEGER NOT NULL DEFAULT 0 CONSTRAINT tasks_attempts_check CHECK (attempts >= 0),
    reason         TEXT    NOT NULL,
    last_error     TEXT,
    traceparent    TEXT,
    created_at_us  INTEGER NOT NULL,
    updated_at_us  INTEGER NOT NULL,
    -- A task holds a lease exactly while it runs.
    CONSTRAINT tasks_lease_check CHECK (
        (state = 'running') = (locked_by IS NOT NULL AND locked_at_us IS NOT NULL)
    )
);

-- At most one queued-or-running task per (instance, kind). Enqueue relies on
-- it (INSERT ... ON CONFLICT DO NOTHING), so duplicates are impossible even
-- between racing writers.
CREATE UNIQUE INDEX tasks_one_active_per_instance_kind
    ON tasks (instance_id, kind) WHERE state IN ('queued', 'running');

-- Claim order: due queued tasks, oldest first.
CREATE INDEX tasks_due ON tasks (run_after_us, id) WHERE state = 'queued';

-- Lease expiry scans running tasks only.
CREATE INDEX tasks_running ON tasks (locked_at_us) WHERE state = 'running';

CREATE TABLE rollouts (
    service_type   TEXT    PRIMARY KEY,
    state          TEXT    NOT NULL CONSTRAINT rollouts_state_check CHECK (state IN ('active', 'halted')),
    reason         TEXT    NOT NULL,
    updated_at_us  INTEGER NOT NULL
);

-- The reconciler singleton (C2): exactly one row. `epoch` increments on each
-- change of holder; fenced writes compare it inside their transaction.
CREATE TABLE reconciler_lease (
    id             INTEGER PRIMARY KEY CONSTRAINT reconciler_lease_singleton CHECK (id = 1),
    holder         TEXT,
    epoch          INTEGER NOT NULL DEFAULT 0,
    expires_at_us  INTEGER
);

INSERT INTO reconciler_lease (id, holder, epoch, expires_at_us) VALUES (1, NULL, 0, NULL);
