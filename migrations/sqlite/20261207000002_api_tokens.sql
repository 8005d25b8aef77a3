-- The tenant API's tokens (#54). Only the SHA-256 of a token's secret is
-- kept: the secret is shown once, at `stead token create`. A revoked
-- token's row stays (who had access, and until when).
CREATE TABLE tokens (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    team           TEXT    NOT NULL CONSTRAINT tokens_team_nonempty CHECK (team <> ''),
    role           TEXT    NOT NULL CONSTRAINT tokens_role_check CHECK (role IN ('tenant', 'operator')),
    secret_sha256  TEXT    NOT NULL CONSTRAINT tokens_secret_sha256_unique UNIQUE,
    label          TEXT    NOT NULL DEFAULT '',
    created_at_us  INTEGER NOT NULL,
    expires_at_us  INTEGER,
    revoked_at_us  INTEGER
);

-- What an instance counts against its team's quotas ([teams.NAME] in
-- stead.toml), recorded when it is created: the quota check of the next
-- create sums these over the team's live instances in its own transaction.
ALTER TABLE instances ADD COLUMN quota_memory_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN quota_public_hosts INTEGER NOT NULL DEFAULT 0;
CREATE INDEX instances_team ON instances (team);
