-- A new ledger: the whole current layout (schema version 2) in one step.
-- Every statement is IF NOT EXISTS, and no statement or comment holds a semicolon
-- but the one ending it (the Python loader runs the file statement by statement).
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
  tbl TEXT NOT NULL,
  scope TEXT NOT NULL,
  key TEXT NOT NULL,
  version INTEGER NOT NULL,
  state TEXT,
  due_at INTEGER,
  body TEXT NOT NULL,
  owner TEXT,
  PRIMARY KEY (tbl, scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rows_due ON rows (tbl, due_at) WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS rows_state ON rows (tbl, state);
CREATE TABLE IF NOT EXISTS audit (
  scope TEXT NOT NULL,
  key TEXT NOT NULL,
  version INTEGER NOT NULL,
  at INTEGER NOT NULL,
  kind TEXT NOT NULL,
  from_state TEXT,
  to_state TEXT,
  attempt INTEGER,
  detail TEXT NOT NULL,
  PRIMARY KEY (scope, key, version)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS audit_kind ON audit (kind);
CREATE INDEX IF NOT EXISTS rows_owner_due ON rows (tbl, owner, due_at) WHERE due_at IS NOT NULL;
