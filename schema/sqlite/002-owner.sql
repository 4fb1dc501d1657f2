-- Version 1 to 2: operation rows name their owner. A version-1 ledger's operation rows
-- were all written by hosts without an owner name, so they become the default owner's.
ALTER TABLE rows ADD COLUMN owner TEXT;
UPDATE rows SET owner = 'default' WHERE tbl = 'operation';
CREATE INDEX IF NOT EXISTS rows_owner_due ON rows (tbl, owner, due_at) WHERE due_at IS NOT NULL;
