-- T3: one lock per instance across processes. Recovery, workers and
-- operator commands take it (recovery only tries, and skips a busy instance).
-- A lock expires by the database's clock, so a process that died holding one
-- blocks the instance for its length at most; a daemon restarted under the
-- same identity clears its earlier incarnation's locks at once.
CREATE TABLE instance_locks (
    instance_id    BIGINT PRIMARY KEY REFERENCES instances (id) ON DELETE CASCADE,
    holder         TEXT NOT NULL CONSTRAINT instance_locks_holder_nonempty CHECK (holder <> ''),
    expires_at_us  BIGINT NOT NULL
);
