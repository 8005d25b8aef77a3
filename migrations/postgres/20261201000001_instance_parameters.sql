-- Per-instance parameters (#17): the values given at `instance create --set
-- key=value`, a JSON object of strings, which the catalog's env templates
-- read as {param.key}.
ALTER TABLE instances ADD COLUMN parameters TEXT NOT NULL DEFAULT '{}';
-- Set by `instance delete --purge-volumes`: the deprovision then removes
-- the instance's named volumes too (a plain delete keeps them).
ALTER TABLE instances ADD COLUMN purge_volumes BOOLEAN NOT NULL DEFAULT FALSE;
