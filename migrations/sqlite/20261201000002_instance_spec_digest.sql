-- The digest of the catalog spec an instance last provisioned or upgraded
-- to (#17): a catalog that changes a type's spec without changing its
-- version upgrades the instances that recorded another digest. NULL (rows
-- from before) counts as current until the next version.
ALTER TABLE instances ADD COLUMN spec_digest TEXT;
