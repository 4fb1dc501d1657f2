//! The ledger's DDL, included from the repository's `schema/` directory,
//! which the Python and npm packages ship too: one set of files for every
//! host. How a ledger applies them is `schema/README.md`; this is that rule.

/// One backend's files: how a ledger of it is created and upgraded.
pub(crate) struct Migrations {
    /// `000-*.sql`: run first by every migration.
    pub bootstrap: Option<&'static str>,
    /// `ledger.sql`: a new ledger's whole current layout, instead of the steps.
    pub fresh: Option<&'static str>,
    /// `NNN-name.sql`: (NNN, text), each taking a ledger from version NNN - 1
    /// to NNN, in ascending order.
    pub steps: &'static [(u32, &'static str)],
}

/// What one migration runs: a label for errors, and the SQL.
pub(crate) struct Step {
    /// The version the SQL brings the ledger to.
    pub version: u32,
    /// Whether this is the fresh layout rather than an upgrade step.
    pub fresh: bool,
    /// The file's text, placeholders not yet replaced.
    pub sql: &'static str,
}

impl Migrations {
    /// The version the files bring a ledger to: the highest step's.
    pub fn current(&self) -> u32 {
        self.steps.last().map_or(0, |&(n, _)| n)
    }

    /// What a ledger recorded at `found` runs, in order (the bootstrap apart):
    /// a new ledger the fresh layout if there is one, else every step; any
    /// other the steps above `found`.
    pub fn plan(&self, found: u32) -> Vec<Step> {
        match self.fresh {
            Some(sql) if found == 0 => vec![Step {
                version: self.current(),
                fresh: true,
                sql,
            }],
            _ => self
                .steps
                .iter()
                .filter(|&&(n, _)| n > found)
                .map(|&(version, sql)| Step {
                    version,
                    fresh: false,
                    sql,
                })
                .collect(),
        }
    }
}

/// The SQLite ledger's files.
pub(crate) const SQLITE: Migrations = Migrations {
    bootstrap: None,
    fresh: Some(include_str!("../../../../schema/sqlite/ledger.sql")),
    steps: &[(2, include_str!("../../../../schema/sqlite/002-owner.sql"))],
};

/// The PostgreSQL ledger's files; `{schema}` stands for the quoted schema name.
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Migrations = Migrations {
    bootstrap: Some(include_str!("../../../../schema/postgres/000-meta.sql")),
    fresh: None,
    steps: &[
        (1, include_str!("../../../../schema/postgres/001-ledger.sql")),
        (2, include_str!("../../../../schema/postgres/002-owner.sql")),
        (3, include_str!("../../../../schema/postgres/003-apply-batch.sql")),
    ],
};

/// A `postgres/` file's text for one schema: every `{schema}` replaced by
/// `quoted`, the schema's quoted identifier.
#[cfg(feature = "postgres")]
pub(crate) fn for_schema(sql: &str, quoted: &str) -> String {
    sql.replace("{schema}", quoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file under `schema/<backend>/`, by name: each must be in the
    /// table above, or a new step would never run here.
    fn files(backend: &str) -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../schema")
            .join(backend);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        names.sort();
        names
    }

    fn listed(m: &Migrations) -> Vec<String> {
        let mut names: Vec<String> = m.bootstrap.iter().map(|_| "000".to_string()).collect();
        names.extend(m.steps.iter().map(|(n, _)| format!("{n:03}")));
        names.extend(m.fresh.iter().map(|_| "ledger".to_string()));
        names
    }

    fn prefixes(backend: &str) -> Vec<String> {
        let mut names: Vec<String> = files(backend)
            .iter()
            .map(|n| match n.split_once('-') {
                Some((number, _)) if number.len() == 3 && number.bytes().all(|b| b.is_ascii_digit()) => {
                    number.to_string()
                }
                _ => n.trim_end_matches(".sql").to_string(),
            })
            .collect();
        names.sort();
        names
    }

    /// `m` includes every file of `schema/<backend>/` and ends at the store's `version`.
    fn includes_every_file(backend: &str, m: &Migrations, version: u32) {
        let mut want = listed(m);
        want.sort();
        assert_eq!(prefixes(backend), want);
        assert_eq!(m.current(), version);
    }

    #[test]
    fn sqlite_includes_every_file_and_is_at_its_version() {
        includes_every_file("sqlite", &SQLITE, crate::storage::sqlite::SCHEMA_VERSION);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_includes_every_file_and_is_at_its_version() {
        includes_every_file("postgres", &POSTGRES, crate::storage::postgres::SCHEMA_VERSION);
    }

    #[test]
    fn a_new_ledger_takes_the_fresh_layout_and_an_old_one_the_steps_above_it() {
        let plan = |m: &Migrations, found| m.plan(found).iter().map(|s| (s.version, s.fresh)).collect::<Vec<_>>();
        assert_eq!(plan(&SQLITE, 0), [(2, true)]);
        assert_eq!(plan(&SQLITE, 1), [(2, false)]);
        assert!(plan(&SQLITE, 2).is_empty());
        let steps_only = Migrations {
            bootstrap: None,
            fresh: None,
            steps: &[(1, "a"), (2, "b"), (3, "c")],
        };
        assert_eq!(plan(&steps_only, 0), [(1, false), (2, false), (3, false)]);
        assert_eq!(plan(&steps_only, 2), [(3, false)]);
    }
}
