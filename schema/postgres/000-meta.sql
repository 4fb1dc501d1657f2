-- Run first by every migration, under the schema's advisory lock: the schema and its
-- meta table, which must exist before the recorded version can be read.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.meta (key text PRIMARY KEY, value text NOT NULL);
