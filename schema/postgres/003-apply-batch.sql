-- Version 2 to 3: apply_batch, a whole batch in one statement, so one round trip: its puts'
-- compare-and-swap, then its audit events. A conflict raises SQLSTATE OC409 and so rolls the
-- statement back. The Rust host calls it; the Python and Node ledgers run their own transaction
-- of statements, which the function does not change.
CREATE OR REPLACE FUNCTION {schema}.apply_batch(
  p_kind smallint[], p_tbl text[], p_scope text[], p_key text[], p_expected bigint[],
  p_version bigint[], p_state text[], p_due bigint[], p_body text[], p_owner text[],
  e_scope text[], e_key text[], e_version bigint[], e_at bigint[], e_kind text[],
  e_from text[], e_to text[], e_attempt bigint[], e_detail text[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  n bigint;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
    IF p_kind[i] = 0 THEN
      INSERT INTO {schema}.rows (tbl, scope, key, version, state, due_at, body, owner)
        VALUES (p_tbl[i], p_scope[i], p_key[i], p_version[i], p_state[i], p_due[i], p_body[i], p_owner[i])
        ON CONFLICT DO NOTHING;
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSIF p_kind[i] = 1 THEN
      UPDATE {schema}.rows SET version = p_version[i], state = p_state[i], due_at = p_due[i], body = p_body[i],
          owner = p_owner[i]
        WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i] AND version = p_expected[i];
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSIF p_kind[i] = 2 THEN
      DELETE FROM {schema}.rows
        WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i] AND version = p_expected[i];
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSE
      -- Must not exist, and stays absent: take the key as an insert would, then let go.
      INSERT INTO {schema}.rows (tbl, scope, key, version, state, due_at, body)
        VALUES (p_tbl[i], p_scope[i], p_key[i], 0, NULL, NULL, '') ON CONFLICT DO NOTHING;
      GET DIAGNOSTICS n = ROW_COUNT;
      IF n = 1 THEN
        DELETE FROM {schema}.rows WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i];
      END IF;
    END IF;
    IF n <> 1 THEN
      RAISE EXCEPTION USING ERRCODE = 'OC409', MESSAGE = 'once: version conflict';
    END IF;
  END LOOP;
  FOR i IN 1 .. coalesce(array_length(e_scope, 1), 0) LOOP
    INSERT INTO {schema}.audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
      VALUES (e_scope[i], e_key[i], e_version[i], e_at[i], e_kind[i], e_from[i], e_to[i], e_attempt[i], e_detail[i])
      ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
      RAISE EXCEPTION USING ERRCODE = 'OC409', MESSAGE = 'once: version conflict';
    END IF;
  END LOOP;
END
$$;
