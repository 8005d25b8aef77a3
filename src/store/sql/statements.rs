//! The SQL text of the stores. Most statements both dialects accept verbatim:
//! SQLite reads `$N` as the N-th bound parameter, exactly as Postgres does. The
//! claims differ (locking), and sit at the end.
//! Every value is bound; nothing is formatted into SQL. Public so the queue
//! benchmark can run the very same statements without the store around them.

pub const CREATE_INSTANCE: &str = "INSERT INTO instances \
     (name, team, service_type, version, state, stopped, expires_at_us, maintenance_window, \
      created_at_us, updated_at_us, parameters, spec_digest, domains) \
     VALUES ($1, $2, $3, $4, 'provisioning', FALSE, $5, $6, $7, $7, $8, $9, $10) \
     RETURNING id, name, team, service_type, version, state, stopped, \
     expires_at_us, maintenance_window, created_at_us, updated_at_us, parameters, purge_volumes, spec_digest, domains";

pub const INSTANCE_BY_NAME: &str = "SELECT id, name, team, service_type, version, state, stopped, \
     expires_at_us, maintenance_window, created_at_us, updated_at_us, parameters, purge_volumes, spec_digest, domains \
     FROM instances WHERE name = $1";

/// The instance's tasks that have not finished; a deleted instance with any
/// keeps its name.
pub const ACTIVE_TASKS_OF_INSTANCE: &str =
    "SELECT COUNT(*) FROM tasks WHERE instance_id = $1 AND state IN ('queued', 'running')";

/// Frees a deleted instance's name: its finished tasks, then its row (ACTIVE
/// and inhibitions cascade). Guarded on `deleted` so a live row is never
/// removed.
pub const DELETE_FINISHED_TASKS_OF_INSTANCE: &str =
    "DELETE FROM tasks WHERE instance_id = $1 AND state IN ('done', 'failed')";
pub const DELETE_DELETED_INSTANCE: &str =
    "DELETE FROM instances WHERE id = $1 AND state = 'deleted'";

pub const INSTANCE_BY_ID: &str = "SELECT id, name, team, service_type, version, state, stopped, \
     expires_at_us, maintenance_window, created_at_us, updated_at_us, parameters, purge_volumes, spec_digest, domains \
     FROM instances WHERE id = $1";

pub const LIST_INSTANCES: &str = "SELECT id, name, team, service_type, version, state, stopped, \
     expires_at_us, maintenance_window, created_at_us, updated_at_us, parameters, purge_volumes, spec_digest, domains \
     FROM instances ORDER BY id";

/// What a whole recovery pass lists of every instance (`ListedRow`).
pub const LIST_FOR_RECOVERY: &str =
    "SELECT id, name, service_type, state FROM instances ORDER BY id";

/// Compare-and-set: the `WHERE state = $2` is the compare.
pub const SET_INSTANCE_STATE: &str =
    "UPDATE instances SET state = $3, updated_at_us = $4 WHERE id = $1 AND state = $2";

pub const SET_INSTANCE_STOPPED: &str =
    "UPDATE instances SET stopped = $2, updated_at_us = $3 WHERE id = $1";

pub const SET_INSTANCE_PURGE_VOLUMES: &str =
    "UPDATE instances SET purge_volumes = TRUE, updated_at_us = $2 WHERE id = $1";

pub const SET_INSTANCE_VERSION: &str =
    "UPDATE instances SET version = $2, updated_at_us = $3 WHERE id = $1";

pub const SET_INSTANCE_SPEC_DIGEST: &str =
    "UPDATE instances SET spec_digest = $2, updated_at_us = $3 WHERE id = $1";

pub const INSTANCE_COUNTS: &str = "SELECT state, COUNT(*) FROM instances GROUP BY state";
/// The service types with instances in any state but the one bound
/// (`deleted`).
pub const LIVE_SERVICE_TYPES: &str =
    "SELECT DISTINCT service_type FROM instances WHERE state <> $1 ORDER BY service_type";

// --- ACTIVE ---------------------------------------------------------------

pub const LOAD_ACTIVE: &str = "SELECT a.instance_id, a.service, a.container_id, \
     a.effective_revision, a.backend_binds, a.stop_grace_ms, a.verified_started_at_ns \
     FROM active_services a JOIN instances i ON i.id = a.instance_id WHERE i.name = $1";

/// An upsert keyed by the instance's name: no row is written (0 rows
/// affected) when the instance does not exist. The `WHERE` also keeps
/// SQLite's parser from reading `ON CONFLICT` as a join constraint.
pub const SAVE_ACTIVE: &str = "INSERT INTO active_services \
     (instance_id, service, container_id, effective_revision, backend_binds, stop_grace_ms, \
      verified_started_at_ns) \
     SELECT id, $2, $3, $4, $5, $6, $7 FROM instances WHERE name = $1 \
     ON CONFLICT (instance_id, service) DO UPDATE SET \
       container_id = excluded.container_id, \
       effective_revision = excluded.effective_revision, \
       backend_binds = excluded.backend_binds, \
       stop_grace_ms = excluded.stop_grace_ms, \
       verified_started_at_ns = excluded.verified_started_at_ns";

pub const REMOVE_ACTIVE: &str = "DELETE FROM active_services \
     WHERE instance_id = (SELECT id FROM instances WHERE name = $1) AND service = $2";

/// R13: binds land only if ACTIVE still names this exact generation.
pub const PERSIST_BINDS: &str = "UPDATE active_services SET backend_binds = $5 \
     WHERE instance_id = (SELECT id FROM instances WHERE name = $1) \
       AND service = $2 AND container_id = $3 AND effective_revision = $4";

pub const RECORD_VERIFIED: &str = "UPDATE active_services SET verified_started_at_ns = $4 \
     WHERE instance_id = (SELECT id FROM instances WHERE name = $1) \
       AND service = $2 AND container_id = $3";

pub const RELEASE_CLAIMS: &str = "UPDATE active_services SET backend_binds = '{}' \
     WHERE instance_id = (SELECT id FROM instances WHERE name = $1) AND container_id = $2";

// --- inhibitions ----------------------------------------------------------

pub const LOAD_INHIBITIONS: &str = "SELECT h.instance_id, h.service, h.container_id, h.reason, \
     h.operation, h.created_at_us, h.stop_grace_ms, h.revert_to \
     FROM inhibitions h JOIN instances i ON i.id = h.instance_id WHERE i.name = $1";

/// Every marker that carries a way back, for `Store::ways_back`.
pub const WAYS_BACK: &str = "SELECT h.instance_id, h.service, h.container_id, h.reason, \
     h.operation, h.created_at_us, h.stop_grace_ms, h.revert_to \
     FROM inhibitions h WHERE h.revert_to IS NOT NULL";

pub const SAVE_INHIBITION: &str = "INSERT INTO inhibitions \
     (instance_id, service, container_id, reason, operation, created_at_us, stop_grace_ms, \
      revert_to) \
     SELECT id, $2, $3, $4, $5, $6, $7, $8 FROM instances WHERE name = $1 \
     ON CONFLICT (instance_id, service, container_id) DO UPDATE SET \
       reason = excluded.reason, \
       operation = excluded.operation, \
       created_at_us = excluded.created_at_us, \
       stop_grace_ms = excluded.stop_grace_ms, \
       revert_to = excluded.revert_to";

pub const CLEAR_INHIBITION: &str = "DELETE FROM inhibitions \
     WHERE instance_id = (SELECT id FROM instances WHERE name = $1) \
       AND service = $2 AND container_id = $3";

// --- tasks ----------------------------------------------------------------

/// Idempotent through the partial unique index: a second active task of the
/// same (instance, kind) inserts nothing and returns no id. The conflict
/// target repeats the index predicate so both databases infer that index.
pub const ENQUEUE: &str = "INSERT INTO tasks \
     (kind, instance_id, state, run_after_us, attempts, reason, traceparent, \
      created_at_us, updated_at_us) \
     VALUES ($1, $2, 'queued', $3, 0, $4, $5, $6, $6) \
     ON CONFLICT (instance_id, kind) WHERE state IN ('queued', 'running') DO NOTHING \
     RETURNING id";

pub const EXTEND_LEASE: &str = "UPDATE tasks SET locked_at_us = $3, updated_at_us = $3 \
     WHERE id = $1 AND state = 'running' AND locked_by = $2";

pub const COMPLETE: &str = "UPDATE tasks \
     SET state = 'done', locked_by = NULL, locked_at_us = NULL, updated_at_us = $3 \
     WHERE id = $1 AND state = 'running' AND locked_by = $2";

pub const RETRY: &str = "UPDATE tasks \
     SET state = 'queued', locked_by = NULL, locked_at_us = NULL, run_after_us = $3, \
         last_error = $4, updated_at_us = $5 \
     WHERE id = $1 AND state = 'running' AND locked_by = $2";

pub const FAIL: &str = "UPDATE tasks \
     SET state = 'failed', locked_by = NULL, locked_at_us = NULL, last_error = $3, \
         updated_at_us = $4 \
     WHERE id = $1 AND state = 'running' AND locked_by = $2";

/// C6: `$2` is [`crate::store::lease_cutoff_us`]; strictly older leases only.
pub const RESET_EXPIRED: &str = "UPDATE tasks \
     SET state = 'queued', locked_by = NULL, locked_at_us = NULL, updated_at_us = $1 \
     WHERE state = 'running' AND locked_at_us < $2";

/// Queued and running tasks, plus rows in a state stead does not know (so
/// they are reported as bad rows instead of silently missing).
pub const ACTIVE_TASKS: &str = "SELECT id, kind, instance_id, state, run_after_us, locked_by, \
     locked_at_us, attempts, reason, last_error, traceparent, created_at_us, updated_at_us \
     FROM tasks WHERE state NOT IN ('done', 'failed') ORDER BY id";

pub const TASK_BY_ID: &str = "SELECT id, kind, instance_id, state, run_after_us, locked_by, \
     locked_at_us, attempts, reason, last_error, traceparent, created_at_us, updated_at_us \
     FROM tasks WHERE id = $1";

pub const QUEUE_DEPTH: &str = "SELECT COUNT(*) FROM tasks WHERE state = 'queued'";

/// T4: a deletion cancels the instance's queued tasks but its deprovision,
/// in the transaction of [`EXPIRE_INSTANCE`] (see
/// `Task::cancelled_by_deletion`, the same rule).
pub const CANCEL_QUEUED_FOR_DELETION: &str = "UPDATE tasks \
     SET state = 'failed', last_error = $3, updated_at_us = $2 \
     WHERE instance_id = $1 AND state = 'queued' AND kind <> 'deprovision' \
     RETURNING id";

/// `stead task cancel`: a queued task only; a running one is never
/// interrupted. Nor is the upgrade of an instance an interrupted upgrade
/// left `upgrading`: it finishes that one off (#40).
pub const CANCEL_QUEUED_TASK: &str = "UPDATE tasks \
     SET state = 'failed', last_error = $2, updated_at_us = $3 \
     WHERE id = $1 AND state = 'queued' \
       AND NOT (kind = 'upgrade' \
         AND instance_id IN (SELECT id FROM instances WHERE state = 'upgrading'))";

/// C8: a halted rollout cancels its type's queued upgrades, but for those
/// of instances an interrupted upgrade left `upgrading`: their worker tidies
/// up without upgrading (#40).
pub const CANCEL_QUEUED_UPGRADES: &str = "UPDATE tasks \
     SET state = 'failed', last_error = $2, updated_at_us = $3 \
     WHERE state = 'queued' AND kind = 'upgrade' AND attempts = 0 \
       AND instance_id IN \
         (SELECT id FROM instances WHERE service_type = $1 AND state <> 'upgrading') \
     RETURNING id";

/// `stead task list`: newest first; finished tasks only when `$1`.
pub const LIST_TASKS: &str = "SELECT id, kind, instance_id, state, run_after_us, locked_by, \
     locked_at_us, attempts, reason, last_error, traceparent, created_at_us, updated_at_us \
     FROM tasks WHERE $1 OR state IN ('queued', 'running') ORDER BY id DESC LIMIT $2";

/// The state change of TTL expiry (C7); runs in one transaction with
/// [`ENQUEUE`].
pub const EXPIRE_INSTANCE: &str = "UPDATE instances SET state = 'deleting', updated_at_us = $3 \
     WHERE id = $1 AND state = $2";

// --- rollouts -------------------------------------------------------------

pub const ROLLOUTS: &str = "SELECT service_type, state FROM rollouts ORDER BY service_type";

pub const ROLLOUT_RECORDS: &str = "SELECT service_type, state, reason, updated_at_us, \
     pinned_version FROM rollouts ORDER BY service_type";

/// Any change of the switch lifts an undo's pin: a resume, and a halt (an
/// operator's, or one after a failed or reverted upgrade: a version that
/// fails on the way back is no way out, and moving on to it again would
/// never end).
pub const SET_ROLLOUT: &str = "INSERT INTO rollouts (service_type, state, reason, updated_at_us) \
     VALUES ($1, $2, $3, $4) \
     ON CONFLICT (service_type) DO UPDATE SET \
       state = excluded.state, reason = excluded.reason, updated_at_us = excluded.updated_at_us, \
       pinned_version = NULL";

/// `rollout undo TYPE --to VERSION`: halted, and pinned to the version.
pub const PIN_ROLLOUT: &str = "INSERT INTO rollouts \
     (service_type, state, reason, updated_at_us, pinned_version) \
     VALUES ($1, 'halted', $3, $4, $2) \
     ON CONFLICT (service_type) DO UPDATE SET \
       state = 'halted', reason = excluded.reason, updated_at_us = excluded.updated_at_us, \
       pinned_version = excluded.pinned_version";

// --- type versions (#40) -----------------------------------------------------

/// A version seen again keeps its first recording time (the history's
/// order) and takes the latest definition.
/// Immutable: a definition recorded once is never rewritten (#54).
pub const RECORD_TYPE_VERSION: &str = "INSERT INTO type_versions \
     (service_type, version, spec_digest, source, recorded_at_us) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (service_type, version, spec_digest) DO NOTHING";

pub const TYPE_VERSIONS: &str =
    "SELECT service_type, version, spec_digest, source, recorded_at_us \
     FROM type_versions WHERE service_type = $1 ORDER BY recorded_at_us, version, spec_digest";

// --- reconciler lease -----------------------------------------------------

pub const WRITE_LEASE: &str =
    "UPDATE reconciler_lease SET holder = $1, epoch = $2, expires_at_us = $3 WHERE id = 1";

// --- instance locks (T3) ------------------------------------------------------

/// A restarted daemon's earlier incarnations at its site are gone (its
/// identity's file lock says so): their locks go with them. `$1` is the
/// predecessors' prefix, `<identity>#<site>.`.
pub const CLEAR_INSTANCE_LOCKS_OF: &str =
    "DELETE FROM instance_locks WHERE substr(holder, 1, length($1)) = $1";

/// T1: the running tasks of a restarted daemon's earlier incarnations at
/// its site, queued again at once (attempts kept).
pub const REQUEUE_TASKS_OF: &str = "UPDATE tasks \
     SET state = 'queued', locked_by = NULL, locked_at_us = NULL, updated_at_us = $2 \
     WHERE state = 'running' AND substr(locked_by, 1, length($1)) = $1 \
     RETURNING id";

// --- the event log (#42) ------------------------------------------------

/// The team is the instance's, read in the same statement (#54).
pub const INSERT_EVENT: &str = "INSERT INTO events \
     (at_us, kind, instance, service, container, reason, message, until_us, trace_id, task_id, \
      writer, team) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
      (SELECT team FROM instances WHERE name = $3))";

/// A read of the event log in one order: the filters, each off when its
/// parameter is NULL (instance, kind, team) or at its neutral bound
/// (since, after id), then the order and the limit.
macro_rules! events_in_order {
    ($order:literal) => {
        concat!(
            "SELECT id, at_us, kind, instance, service, container, reason, message, \
             until_us, trace_id, task_id, writer, team FROM events \
             WHERE ($1 IS NULL OR instance = $1) AND ($2 IS NULL OR kind = $2) \
             AND at_us >= $3 AND id > $4 AND ($6 IS NULL OR team = $6) ORDER BY id ",
            $order,
            " LIMIT $5"
        )
    };
}

/// The newest events the filters admit (the caller puts them in id order).
pub const NEWEST_EVENTS: &str = events_in_order!("DESC");
/// The oldest events after an id (following the log).
pub const OLDEST_EVENTS: &str = events_in_order!("ASC");

/// Retention: a bounded batch of the oldest events written before `$1`.
pub const PRUNE_EVENTS: &str = "DELETE FROM events WHERE id IN \
     (SELECT id FROM events WHERE at_us < $1 ORDER BY at_us, id LIMIT $2)";
/// Finished tasks last changed before `$1`, oldest first, at most `$2`
/// (#41: retention, with the event log's).
pub const PRUNE_FINISHED_TASKS: &str = "DELETE FROM tasks WHERE id IN \
     (SELECT id FROM tasks WHERE state IN ('done', 'failed') AND updated_at_us < $1 \
     ORDER BY updated_at_us, id LIMIT $2)";

/// Retention of the type versions (#54): recorded before `$1`, run by no
/// live instance, pinned by no rollout, and not the newest of its type.
pub const PRUNE_TYPE_VERSIONS: &str = "DELETE FROM type_versions \
     WHERE recorded_at_us < $1 \
     AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.service_type = type_versions.service_type \
       AND i.version = type_versions.version AND i.state <> 'deleted') \
     AND NOT EXISTS (SELECT 1 FROM rollouts r WHERE r.service_type = type_versions.service_type \
       AND r.pinned_version = type_versions.version) \
     AND recorded_at_us < (SELECT MAX(n.recorded_at_us) FROM type_versions n \
       WHERE n.service_type = type_versions.service_type)";

// --- webhook cursors (#42) ------------------------------------------------

pub const WEBHOOK_CURSOR: &str = "SELECT last_event_id FROM webhook_cursors WHERE webhook = $1";
/// A webhook's first cursor; nothing when another process set one first.
pub const INSERT_WEBHOOK_CURSOR: &str = "INSERT INTO webhook_cursors \
     (webhook, last_event_id, updated_at_us) VALUES ($1, $2, $3) \
     ON CONFLICT (webhook) DO NOTHING";
/// Compare-and-set: moves the cursor only from where the caller read it.
pub const ADVANCE_WEBHOOK_CURSOR: &str = "UPDATE webhook_cursors \
     SET last_event_id = $3, updated_at_us = $4 \
     WHERE webhook = $1 AND last_event_id = $2";

// --- claims: where the dialects differ in locking ---------------------------

/// SQLite claims with one `UPDATE … RETURNING`: the statement is atomic and
/// holds the write lock, so no two workers can claim the same row. Rows in a
/// kind stead does not know are never claimed (they are reported by
/// `active_tasks` instead of wedging the head of the queue).
pub const SQLITE_CLAIM: &str = "UPDATE tasks \
     SET state = 'running', locked_by = $1, locked_at_us = $2, attempts = attempts + 1, \
         updated_at_us = $2 \
     WHERE id IN ( \
       SELECT id FROM tasks \
       WHERE state = 'queued' AND run_after_us <= $2 \
         AND kind IN ('provision', 'reprovision', 'upgrade', 'deprovision') \
       ORDER BY run_after_us, id LIMIT $3) \
     RETURNING id, kind, instance_id, state, run_after_us, locked_by, locked_at_us, attempts, \
       reason, last_error, traceparent, created_at_us, updated_at_us";

/// Claims lock the due rows they take and skip rows another claimer locked:
/// two workers never take the same row, and neither waits for the other.
/// Under READ COMMITTED a row locked after another transaction changed it is
/// re-checked against `state = 'queued'`, so a just-claimed row is skipped.
/// Rows in a kind stead does not know are never claimed (they are reported
/// by `active_tasks` instead of wedging the head of the queue).
pub const POSTGRES_CLAIM: &str = "WITH due AS ( \
       SELECT id AS due_id FROM tasks \
       WHERE state = 'queued' AND run_after_us <= $2 \
         AND kind IN ('provision', 'reprovision', 'upgrade', 'deprovision') \
       ORDER BY run_after_us, id LIMIT $3 \
       FOR UPDATE SKIP LOCKED) \
     UPDATE tasks \
     SET state = 'running', locked_by = $1, locked_at_us = $2, attempts = attempts + 1, \
         updated_at_us = $2 \
     FROM due WHERE id = due_id \
     RETURNING id, kind, instance_id, state, run_after_us, locked_by, locked_at_us, attempts, \
       reason, last_error, traceparent, created_at_us, updated_at_us";
