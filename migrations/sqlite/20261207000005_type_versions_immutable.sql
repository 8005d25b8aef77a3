-- #54: a recorded type version is immutable. One row per (type, version,
-- spec digest), written once by the reconciler lease holder and never
-- rewritten: a catalog that changes a version's spec in place records a
-- second definition beside the first instead of replacing the one the
-- instances at it were made from. SQLite cannot change a primary key in
-- place: the table is rebuilt.
CREATE TABLE type_versions_by_digest (
    service_type    TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    spec_digest     TEXT    NOT NULL,
    source          TEXT    NOT NULL,
    recorded_at_us  INTEGER NOT NULL,
    PRIMARY KEY (service_type, version, spec_digest)
);
INSERT INTO type_versions_by_digest
    (service_type, version, spec_digest, source, recorded_at_us)
    SELECT service_type, version, spec_digest, source, recorded_at_us FROM type_versions;
DROP TABLE type_versions;
ALTER TABLE type_versions_by_digest RENAME TO type_versions;
