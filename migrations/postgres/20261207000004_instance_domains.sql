-- Public host names a tenant gives an instance at create (#54): a JSON
-- array of DNS names, each within the team's `domain_suffixes`, served by
-- the type's service with `tenant_domains = true`.
ALTER TABLE instances ADD COLUMN domains TEXT NOT NULL DEFAULT '[]';
