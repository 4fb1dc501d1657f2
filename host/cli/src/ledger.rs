//! `once ledger …`: list, show, resolve, adopt and count records.

use std::io::{self, Write};

use clap::Subcommand;
use once::Once;
use once::types::{Resolution, State};

use crate::Failure;

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// List records (scope, key, state, version).
    List {
        /// Only records in this state (in-flight, confirmed, failed, unknown, absent, superseded,
        /// awaiting-approval, denied).
        #[arg(long, value_parser = parse_state)]
        state: Option<State>,
        /// Most records to list.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Show one record and its audit trail.
    Show {
        /// Operation key.
        key: String,
        /// Scope of the key.
        #[arg(long, default_value = "default")]
        scope: String,
    },
    /// Resolve an unknown or absent record as an operator (audited).
    Resolve {
        /// Operation key.
        key: String,
        /// Scope of the key.
        #[arg(long, default_value = "default")]
        scope: String,
        /// The effect happened; this JSON is its receipt.
        #[arg(long, conflicts_with = "absent", required_unless_present = "absent")]
        confirmed: Option<String>,
        /// The effect did not happen; a dispatch is owed.
        #[arg(long)]
        absent: bool,
        /// Why (kept in the audit trail).
        #[arg(long)]
        note: String,
        /// Resolve absent even before max_in_flight has passed since the last dispatch.
        #[arg(long)]
        force: bool,
    },
    /// Approve a call awaiting approval, as it is recorded (its payload's fingerprint): the
    /// next attempt may be sent within the tool's approval validity (audited with the note).
    Approve {
        /// Operation key.
        key: String,
        /// Scope of the key.
        #[arg(long, default_value = "default")]
        scope: String,
        /// Who approves and why (kept in the audit trail).
        #[arg(long)]
        note: String,
    },
    /// Deny a call awaiting approval: it ends denied, nothing is sent, and any spend it reserved is
    /// released (audited with the note).
    Deny {
        /// Operation key.
        key: String,
        /// Scope of the key.
        #[arg(long, default_value = "default")]
        scope: String,
        /// Who denies and why (kept in the audit trail).
        #[arg(long)]
        note: String,
    },
    /// Move a renamed or retired gateway's (or host's) records to a live owner (each audited), so
    /// its background work reads, escalates and dispatches them; the scopes bound to the old
    /// name move with them.
    Adopt {
        /// The owner whose records move (as `once ledger show` prints it).
        #[arg(long)]
        from: String,
        /// The owner that takes them: a running gateway's (its `--check-config` prints it).
        #[arg(long)]
        to: String,
        /// Why (kept in every moved record's audit trail).
        #[arg(long)]
        note: String,
        /// Most records to move in one go; run again while records are left.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// Records by state; replays, conflicts and unknowns from the audit trail.
    Stats,
}

fn parse_state(s: &str) -> Result<State, String> {
    State::parse(s).ok_or_else(|| {
        let names: Vec<&str> = State::ALL.iter().map(|s| s.name()).collect();
        format!("unknown state {s:?}; one of {}", names.join(", "))
    })
}

/// Writes one line to `$w`; a reader that closed the pipe (`once ledger list | head`) ends the command quietly.
macro_rules! say {
    ($w:expr, $($arg:tt)*) => {
        if let Err(e) = writeln!($w, $($arg)*) {
            return stdout_failed(e);
        }
    };
}

/// A write to stdout that failed: a closed pipe is the reader having seen enough, anything else exit code 1.
fn stdout_failed(e: io::Error) -> Result<(), Failure> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return Ok(());
    }
    Err(Failure {
        code: 1,
        message: format!("writing to stdout: {e}"),
    })
}

pub fn run(once: &Once, command: LedgerCommand) -> Result<(), Failure> {
    let mut w = io::stdout().lock();
    match command {
        LedgerCommand::List { state, limit } => {
            let records = once.list(state, limit)?;
            say!(w, "{:<20} {:<40} {:<11} {:>7}", "SCOPE", "KEY", "STATE", "VERSION");
            for record in records {
                let state = record.state.map_or("-", State::name);
                say!(
                    w,
                    "{:<20} {:<40} {:<11} {:>7}",
                    record.scope,
                    record.key,
                    state,
                    record.version
                );
            }
            Ok(())
        }
        LedgerCommand::Show { key, scope } => {
            let Some(view) = once.inspect(&scope, &key)? else {
                return Err(Failure {
                    code: 2,
                    message: format!("no record for key {key:?} in scope {scope:?}"),
                });
            };
            say!(w, "scope        {}", view.scope);
            say!(w, "key          {} ({:?})", view.key, view.key_source);
            say!(w, "tool         {}", view.tool);
            say!(
                w,
                "state        {}{}",
                view.state,
                if view.escalated { " (escalated)" } else { "" }
            );
            say!(w, "owner        {}", view.owner);
            // The provider account the record is bound to (its policy's `provider_account`), if it names one.
            if let Some(account) = serde_json::from_str::<serde_json::Value>(&view.body)
                .ok()
                .and_then(|b| b["policy"]["provider_account"].as_str().map(String::from))
            {
                say!(w, "account      {account}");
            }
            say!(w, "version      {}", view.version);
            say!(w, "attempts     {}", view.attempts);
            say!(w, "fingerprint  {}", view.fingerprint);
            say!(w, "provider key {}", view.provider_key);
            say!(w, "args         {}", view.args);
            if let Some(receipt) = &view.receipt {
                say!(w, "receipt      {receipt}");
            }
            if let Some(error) = &view.error {
                say!(w, "error        {error}");
            }
            if view.possible_duplicate {
                say!(
                    w,
                    "WARNING      possible duplicate: a success arrived while a newer attempt was in flight"
                );
            }
            if let Some(s) = &view.supersedes {
                say!(w, "supersedes   {s}");
            }
            if let Some(s) = &view.superseded_by {
                say!(w, "superseded by {s}");
            }
            say!(w, "replays      {}   conflicts {}", view.replays, view.conflicts);
            say!(w, "resolvable   {}", resolvable_words(&view.resolvable));
            say!(w, "audit:");
            for e in &view.audit {
                let from = e.from_state.map_or("-", State::name);
                let to = e.to_state.map_or("-", State::name);
                let attempt = e.attempt.map_or(String::new(), |a| format!(" attempt {a}"));
                say!(
                    w,
                    "  v{:<4} {} {:<32} {from} -> {to}{attempt} {}",
                    e.version,
                    e.at,
                    e.kind,
                    e.detail
                );
            }
            Ok(())
        }
        LedgerCommand::Resolve {
            key,
            scope,
            confirmed,
            absent,
            note,
            force,
        } => {
            let resolution = match (confirmed, absent) {
                (Some(receipt), false) => Resolution::Confirmed(receipt),
                _ => Resolution::Absent,
            };
            let state = once.resolve(&scope, &key, &resolution, &note, force)?;
            say!(w, "{key}: {state}");
            Ok(())
        }
        LedgerCommand::Approve { key, scope, note } => {
            let state = once.resolve(&scope, &key, &Resolution::Approve, &note, false)?;
            say!(w, "{key}: {state} (approved: the next attempt may be sent)");
            Ok(())
        }
        LedgerCommand::Deny { key, scope, note } => {
            let state = once.resolve(&scope, &key, &Resolution::Deny, &note, false)?;
            say!(w, "{key}: {state}");
            Ok(())
        }
        LedgerCommand::Adopt { from, to, note, limit } => {
            let report = once.adopt(&from, &to, &note, limit)?;
            say!(w, "adopted {} records of {from:?} as {to:?}", report.adopted);
            // The scopes a gateway bound to the old name go with its records, so the renamed
            // gateway is admitted to them (docs/gateway.md "Whose records").
            for name in once.rebind(&from, &to)? {
                say!(w, "{name} now belongs to {to:?}");
            }
            if report.unreadable > 0 {
                say!(
                    w,
                    "left {} rows this build cannot read (the sweep escalates them)",
                    report.unreadable
                );
            }
            if report.more {
                say!(w, "{from:?} has more records: run the same command again");
            }
            Ok(())
        }
        LedgerCommand::Stats => {
            let stats = once.stats(None)?;
            say!(w, "records by state:");
            for state in State::ALL {
                let n = stats.by_state.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
                say!(w, "  {:<11} {n}", state.name());
            }
            let count = |kinds: &[&str]| -> u64 {
                stats
                    .events
                    .iter()
                    .filter(|(k, _)| kinds.contains(&k.as_str()))
                    .map(|(_, n)| n)
                    .sum()
            };
            say!(w, "replays      {}", count(&["replay"]));
            say!(w, "conflicts    {}", count(&["conflict"]));
            say!(w, "unknowns     {}", count(&["finish-ambiguous", "lease-expired"]));
            Ok(())
        }
    }
}

/// What `once ledger resolve` would accept now, as the engine states it.
fn resolvable_words(r: &once::types::Resolvable) -> String {
    let mut accepted = Vec::new();
    if r.confirmed {
        accepted.push("--confirmed RECEIPT");
    }
    if r.absent && r.absent_needs_force {
        accepted.push("--absent --force (an earlier request may still commit)");
    } else if r.absent {
        accepted.push("--absent");
    }
    if r.approve {
        accepted.push("once ledger approve / once ledger deny");
    }
    if accepted.is_empty() {
        "no (nothing an operator asserts is accepted now)".to_string()
    } else {
        accepted.join(", ")
    }
}
