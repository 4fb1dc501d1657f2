//! The SQL of one store: every statement it prepares, with its schema spelled in.

use crate::storage::codec::ROW_COLUMNS;

/// The statements of one store, by index into [`Sql::texts`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Q {
    Get,
    Apply,
    ScanAny,
    ScanStates,
    Audit,
    ListAll,
    ListState,
    StatsStates,
    StatsEvents,
    Bind,
    Rebind,
    Now,
}

pub(super) const QUERIES: usize = Q::Now as usize + 1;

const NOW_SQL: &str = "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The SQL of one store, its schema spelled in.
pub(super) struct Sql {
    pub(super) texts: Vec<String>,
}

impl Sql {
    pub(super) fn new(schema: &str) -> Self {
        let s = quote_ident(schema);
        let text = |q: Q| -> String {
            match q {
                Q::Get => format!("SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3"),
                Q::Apply => format!(
                    "SELECT {s}.apply_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                                            $11, $12, $13, $14, $15, $16, $17, $18, $19)"
                ),
                Q::ScanAny => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows
                     WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2
                       AND ($4::text IS NULL OR owner = $4)
                     ORDER BY due_at, scope, key LIMIT $3"
                ),
                Q::ScanStates => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows
                     WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2 AND state = ANY($5)
                       AND ($4::text IS NULL OR owner = $4)
                     ORDER BY due_at, scope, key LIMIT $3"
                ),
                Q::Audit => format!(
                    "SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail
                     FROM {s}.audit WHERE scope = $1 AND key = $2 ORDER BY version"
                ),
                Q::ListAll => format!("SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 ORDER BY scope, key LIMIT $2"),
                Q::ListState => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 AND state = $2 ORDER BY scope, key LIMIT $3"
                ),
                Q::StatsStates => {
                    format!(
                        "SELECT state, count(*) FROM {s}.rows
                         WHERE tbl = $1 AND state IS NOT NULL AND ($2::text IS NULL OR scope = $2) GROUP BY state"
                    )
                }
                Q::StatsEvents => format!(
                    "SELECT kind, count(*) FROM {s}.audit WHERE ($1::text IS NULL OR scope = $1) GROUP BY kind ORDER BY kind"
                ),
                // The insert and the read share one snapshot: a binding committed meanwhile by another
                // host is in neither, and the caller asks again.
                Q::Bind => format!(
                    "WITH ins AS (INSERT INTO {s}.meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING \
                     RETURNING value) SELECT value FROM ins UNION ALL SELECT value FROM {s}.meta WHERE key = $1"
                ),
                Q::Rebind => {
                    format!("UPDATE {s}.meta SET value = $2 WHERE starts_with(key, $3) AND value = $1 RETURNING key")
                }
                Q::Now => NOW_SQL.to_string(),
            }
        };
        const ALL: [Q; QUERIES] = [
            Q::Get,
            Q::Apply,
            Q::ScanAny,
            Q::ScanStates,
            Q::Audit,
            Q::ListAll,
            Q::ListState,
            Q::StatsStates,
            Q::StatsEvents,
            Q::Bind,
            Q::Rebind,
            Q::Now,
        ];
        // `texts` is indexed by discriminant: ALL must list Q in declaration order.
        debug_assert!(ALL.iter().enumerate().all(|(i, q)| *q as usize == i));
        Sql {
            texts: ALL.iter().map(|q| text(*q)).collect(),
        }
    }
}

/// A double-quoted SQL identifier.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
