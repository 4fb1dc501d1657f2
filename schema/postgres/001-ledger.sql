-- Version 1: the rows, their indexes, and the append-only audit trail.
CREATE TABLE {schema}.rows (
  tbl text COLLATE "C" NOT NULL CHECK (tbl IN ('operation', 'tombstone', 'quota')),
  scope text COLLATE "C" NOT NULL,
  key text COLLATE "C" NOT NULL,
  version bigint NOT NULL CHECK (version >= 0),
  state text,
  due_at bigint,
  body text NOT NULL,
  PRIMARY KEY (tbl, scope, key)
);
CREATE INDEX rows_due ON {schema}.rows (tbl, due_at, scope, key) WHERE due_at IS NOT NULL;
CREATE INDEX rows_state ON {schema}.rows (tbl, state, scope, key);
CREATE TABLE {schema}.audit (
  scope text COLLATE "C" NOT NULL,
  key text COLLATE "C" NOT NULL,
  version bigint NOT NULL,
  at bigint NOT NULL,
  kind text COLLATE "C" NOT NULL,
  from_state text,
  to_state text,
  attempt bigint,
  detail text NOT NULL,
  PRIMARY KEY (scope, key, version)
);
CREATE INDEX audit_kind ON {schema}.audit (kind);
CREATE FUNCTION {schema}.audit_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the once audit trail is append-only';
END
$$;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {schema}.audit
  FOR EACH ROW EXECUTE FUNCTION {schema}.audit_is_append_only();
