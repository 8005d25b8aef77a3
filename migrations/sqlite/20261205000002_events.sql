-- The event log (#42): one row per intervention or decision, written by
-- the engine in batches and pruned by the reconciler past its retention
-- (`events.retention_days`). Instance, service and container are names
-- and IDs as they were, not references: the log outlives what it tells of.
-- An event of a change the store makes (an enqueue, a TTL expiry) is
-- written in the transaction of that change.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_us      INTEGER NOT NULL,
    kind       TEXT    NOT NULL CONSTRAINT events_kind_nonempty CHECK (kind <> ''),
    instance   TEXT,
    service    TEXT,
    container  TEXT,
    reason     TEXT    NOT NULL,
    message    TEXT    NOT NULL,
    until_us   INTEGER,
    trace_id   TEXT,
    -- The task the event is about (an enqueue's), when there is one.
    task_id    INTEGER,
    writer     TEXT    NOT NULL CONSTRAINT events_writer_nonempty CHECK (writer <> '')
);
CREATE INDEX events_at ON events (at_us);
CREATE INDEX events_instance ON events (instance, id);
