-- The ledger's witness (wit/once.wit `witness`; docs/design.md "Older history"): the record of
-- every attempt handed out, kept in a file of its own beside an SQLite ledger (`<ledger>.witness`),
-- which restoring an older copy of the ledger file leaves as it is. One row per operation: the
-- record body last kept (`body`) and when its attempt was granted (`at`, ledger clock, ms).
-- Not the ledger: no version, no steps; every host runs this on open.
CREATE TABLE IF NOT EXISTS witness (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    at INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (scope, key)
);
