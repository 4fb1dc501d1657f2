//! The operator's metrics (`GET /metrics` of `once ui` and the gateway):
//! the ledger's state in the Prometheus text format (0.0.4).
//!
//! Every figure is read from the ledger (its counts and audit trail) and
//! from the engine's queue, so it is the same whichever process serves it.
//! Refused (blocked) calls are not among them: a refusal writes nothing to
//! the ledger, so only the process that refused a call can count it.

use std::fmt::Write as _;

use crate::bindings::types::{Attention, OperatorQueue, State};
use crate::storage::Stats;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How many pending records the queue behind the metrics examines by default
/// (`once ui`'s and the gateway's `/metrics`).
pub const DEFAULT_QUEUE_LIMIT: u32 = 1000;

/// The metrics of a ledger (as one operator may see it: `stats` and `queue`
/// already limited to their scopes).
pub fn render(stats: &Stats, queue: &OperatorQueue) -> String {
    let mut out = String::new();
    family(&mut out, "once_records", "gauge", "Operation records by state.");
    for state in State::ALL {
        let n = stats.by_state.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
        let _ = writeln!(out, "once_records{{state=\"{}\"}} {n}", state.name());
    }
    let events = |kind: &str| stats.events.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n);
    family(
        &mut out,
        "once_replays_total",
        "counter",
        "Repeats answered with the stored receipt.",
    );
    let _ = writeln!(out, "once_replays_total {}", events("replay"));
    family(
        &mut out,
        "once_conflicts_total",
        "counter",
        "Calls refused because their key names other args.",
    );
    let _ = writeln!(out, "once_conflicts_total {}", events("conflict"));
    family(
        &mut out,
        "once_escalations_delivered_total",
        "counter",
        "Escalations delivered to the operator sink.",
    );
    let _ = writeln!(out, "once_escalations_delivered_total {}", events("escalated"));
    family(
        &mut out,
        "once_escalations_unacknowledged",
        "gauge",
        "Escalated unknown and absent records the sink has not acknowledged.",
    );
    let unacked = queue
        .entries
        .iter()
        .filter(|e| e.escalated && !e.escalation_acknowledged)
        .count();
    let _ = writeln!(out, "once_escalations_unacknowledged {unacked}");
    family(&mut out, "once_queue", "gauge", "Records that need a person, by why.");
    for (attention, name) in [
        (Attention::Unknown, "unknown"),
        (Attention::Absent, "absent"),
        (Attention::LeaseExpired, "lease-expired"),
        (Attention::Approval, "approval"),
    ] {
        let n = queue.entries.iter().filter(|e| e.attention == attention).count();
        let _ = writeln!(out, "once_queue{{attention=\"{name}\"}} {n}");
    }
    family(
        &mut out,
        "once_oldest_unknown_age_seconds",
        "gauge",
        "How long the oldest unknown record has been unknown (0 when there is none).",
    );
    let oldest = queue
        .entries
        .iter()
        .filter(|e| e.attention == Attention::Unknown)
        .map(|e| queue.now.saturating_sub(e.since))
        .max()
        .unwrap_or(0);
    let _ = writeln!(out, "once_oldest_unknown_age_seconds {}", oldest as f64 / 1000.0);
    family(
        &mut out,
        "once_queue_truncated",
        "gauge",
        "1 when the queue examined fewer pending records than the ledger holds.",
    );
    let _ = writeln!(out, "once_queue_truncated {}", u8::from(queue.truncated));
    family(&mut out, "once_audit_events_total", "counter", "Audit events by kind.");
    for (kind, n) in &stats.events {
        let _ = writeln!(out, "once_audit_events_total{{kind=\"{}\"}} {n}", label(kind));
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value with the format's three escapes.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
