-- #54: a recorded type version is immutable. One row per (type, version,
-- spec digest), written once by the reconciler lease holder and never
-- rewritten: a catalog that changes a version's spec in place records a
-- second definition beside the first instead of replacing the one the
-- instances at it were made from.
ALTER TABLE type_versions DROP CONSTRAINT type_versions_pkey;
ALTER TABLE type_versions ADD PRIMARY KEY (service_type, version, spec_digest);
