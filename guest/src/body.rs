//! An operation record's row body, written by hand: the same JSON text as
//! `serde_json::to_string(&rec)` (field order, escapes, enum names), in a
//! fraction of its time. Every transition writes one; serde's writer, which
//! escapes every field name and grows its buffer as it goes, was the largest
//! single cost of a protected call (BENCHMARKS.md row 2). Reading stays
//! serde's (`store::decode`), which is what proves the two agree: the tests
//! compare this writer with serde's on records in every state.

use alloc::string::String;

use crate::canon::write_string;
use crate::json_out::{Writer, confirmation, identity, key_source, route, state};
use crate::policy::{Policy, Quota};
use crate::record::{Attempt, OpRecord, Reservation};

/// The JSON text of `rec`, as serde_json writes it.
pub fn record_json(rec: &OpRecord) -> String {
    let mut w = Writer::with_capacity(1024 + rec.args.len() + rec.receipt.as_ref().map_or(0, String::len));
    w.0.push('{');
    w.str("scope", &rec.scope);
    w.str("key", &rec.key);
    w.raw("key_source", key_source(rec.key_source));
    w.str("tool", &rec.tool);
    w.str("fingerprint", &rec.fingerprint);
    w.str("args", &rec.args);
    w.str("provider_key", &rec.provider_key);
    w.bool("key_in_args", rec.key_in_args);
    w.str("owner", &rec.owner);
    w.raw("state", state(rec.state));
    w.key("attempts");
    w.list(&rec.attempts, attempt);
    if !rec.previous_fences.is_empty() {
        w.key("previous_fences");
        w.list(&rec.previous_fences, |w, f| write_string(f, &mut w.0));
    }
    if !rec.reported_previous.is_empty() {
        w.key("reported_previous");
        w.list(&rec.reported_previous, |w, f| write_string(f, &mut w.0));
    }
    w.opt_str("receipt", rec.receipt.as_deref());
    w.opt_num("confirmed_by", rec.confirmed_by.map(u64::from));
    w.raw("confirmed_via", rec.confirmed_via.map_or("null", confirmation));
    w.bool("absence_forced", rec.absence_forced);
    w.opt_str("error", rec.error.as_deref());
    w.opt_str("unknown_reason", rec.unknown_reason.as_deref());
    w.opt_num("since", rec.since);
    w.opt_num("deadline", rec.deadline);
    w.opt_num("next_check", rec.next_check);
    w.num("checks", u64::from(rec.checks));
    w.opt_num("last_read_position", rec.last_read_position);
    w.bool("escalated", rec.escalated);
    w.bool("escalation_acked", rec.escalation_acked);
    w.opt_str("escalation_id", rec.escalation_id.as_deref());
    w.bool("possible_duplicate", rec.possible_duplicate);
    w.opt_str("supersedes", rec.supersedes.as_deref());
    w.opt_str("superseded_by", rec.superseded_by.as_deref());
    w.opt_str("spend", rec.spend.as_deref());
    w.key("reservation");
    match &rec.reservation {
        Some(r) => reservation(&mut w, r),
        None => w.0.push_str("null"),
    }
    w.key("policy");
    policy(&mut w, &rec.policy);
    w.num("replays", u64::from(rec.replays));
    w.num("conflicts", u64::from(rec.conflicts));
    w.num("created_at", rec.created_at);
    w.num("updated_at", rec.updated_at);
    w.num("transitioned_at", rec.transitioned_at);
    w.0.push('}');
    w.0
}

fn attempt(w: &mut Writer, a: &Attempt) {
    w.0.push('{');
    w.num("n", u64::from(a.n));
    w.str("fence", &a.fence);
    w.num("granted_at", a.granted_at);
    w.num("lease_until", a.lease_until);
    w.opt_num("ended_at", a.ended_at);
    w.opt_str("outcome", a.outcome.as_deref());
    w.bool("owed", a.owed);
    w.0.push('}');
}

fn reservation(w: &mut Writer, r: &Reservation) {
    w.0.push('{');
    w.str("bucket", &r.bucket);
    w.num("window_start", r.window_start);
    w.num("window_ms", r.window_ms);
    w.str("units", &r.units);
    w.0.push('}');
}

fn policy(w: &mut Writer, p: &Policy) {
    w.0.push('{');
    w.raw("route", p.route.map_or("null", route));
    w.raw("identity", identity(p.identity));
    w.opt_str("key_argument", p.key_argument.as_deref());
    w.bool("key_sent_by_host", p.key_sent_by_host);
    w.key("effect_fields");
    match &p.effect_fields {
        Some(fields) => w.list(fields, |w, f| write_string(f, &mut w.0)),
        None => w.0.push_str("null"),
    }
    w.bool("verify_first", p.verify_first);
    w.bool("provider_claims_key", p.provider_claims_key);
    w.bool("lookup", p.lookup);
    w.num("max_in_flight_ms", p.max_in_flight_ms);
    w.num("dispatch_timeout_ms", p.dispatch_timeout_ms);
    w.num("lease_ms", p.lease_ms);
    w.num("attempt_budget", u64::from(p.attempt_budget));
    w.num("derived_window_ms", p.derived_window_ms);
    w.num("resolve_deadline_ms", p.resolve_deadline_ms);
    w.num("reconcile_interval_ms", p.reconcile_interval_ms);
    w.num("retention_ms", p.retention_ms);
    w.num("tombstone_retention_ms", p.tombstone_retention_ms);
    w.key("quota");
    match &p.quota {
        Some(q) => quota(w, q),
        None => w.0.push_str("null"),
    }
    w.opt_str("descriptor_pin", p.descriptor_pin.as_deref());
    w.0.push('}');
}

fn quota(w: &mut Writer, q: &Quota) {
    w.0.push('{');
    w.str("spend_field", &q.spend_field);
    w.str("ceiling", &q.ceiling);
    w.num("decimals", u64::from(q.decimals));
    w.num("window_ms", q.window_ms);
    w.opt_str("bucket", q.bucket.as_deref());
    w.0.push('}');
}
