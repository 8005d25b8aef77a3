-- `rollout undo TYPE --to VERSION` (#40): each version of a service type
-- the daemon has loaded, as the catalog defined it (the type's own table,
-- as a catalog of one type), so a type can be moved back to a version
-- the catalog no longer holds. Re-read through the catalog's own parser
-- and the operator's grants of the day.
CREATE TABLE type_versions (
    service_type    TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    spec_digest     TEXT    NOT NULL,
    source          TEXT    NOT NULL,
    recorded_at_us  INTEGER NOT NULL,
    PRIMARY KEY (service_type, version)
);

-- The version an operator's undo pinned a halted type to; NULL otherwise.
-- Cleared when the rollout resumes.
ALTER TABLE rollouts ADD COLUMN pinned_version TEXT;
