-- One row per definition, never rewritten (#54): a version whose spec
-- changed without a new version number is recorded beside the first, so
-- what an instance runs (its version and digest) is found exactly and a
-- recorded definition cannot be replaced by a later write.
CREATE TABLE type_versions_by_digest (
    service_type    TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    spec_digest     TEXT    NOT NULL,
    source          TEXT    NOT NULL,
    recorded_at_us  INTEGER NOT NULL,
    PRIMARY KEY (service_type, version, spec_digest)
);
INSERT INTO type_versions_by_digest
    SELECT service_type, version, spec_digest, source, recorded_at_us FROM type_versions;
DROP TABLE type_versions;
ALTER TABLE type_versions_by_digest RENAME TO type_versions;
