-- Version 1 to 2: operation rows name their owner. A version-1 schema's operation rows
-- were all written by hosts without an owner name, so they become the default owner's.
ALTER TABLE {schema}.rows ADD COLUMN owner text COLLATE "C";
UPDATE {schema}.rows SET owner = 'default' WHERE tbl = 'operation';
CREATE INDEX rows_owner_due ON {schema}.rows (tbl, owner, due_at, scope, key) WHERE due_at IS NOT NULL;
