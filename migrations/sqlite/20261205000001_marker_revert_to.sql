-- The way back of a baking upgrade (#40): on an upgrade's
-- `retirement-pending` marker, the predecessor's revision and binds, the
-- instance's version before the upgrade, and the end of the bake window,
-- as one JSON object (`core::types::RevertTo`). NULL on every other row.
ALTER TABLE inhibitions ADD COLUMN revert_to TEXT;
