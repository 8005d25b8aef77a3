-- Retention of finished tasks (#41): the leader's ticks delete done and
-- failed tasks last changed past `events.retention_days`, oldest first,
-- in bounded batches; this index keeps each batch from scanning the queue.
CREATE INDEX tasks_finished ON tasks (updated_at_us, id) WHERE state IN ('done', 'failed');
