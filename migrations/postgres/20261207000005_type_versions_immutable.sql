-- One row per definition, never rewritten (#54): a version whose spec
-- changed without a new version number is recorded beside the first, so
-- what an instance runs (its version and digest) is found exactly and a
-- recorded definition cannot be replaced by a later write.
ALTER TABLE type_versions DROP CONSTRAINT type_versions_pkey;
ALTER TABLE type_versions ADD PRIMARY KEY (service_type, version, spec_digest);
