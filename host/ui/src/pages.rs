//! The pages: the queue of what needs a person, and one record with its
//! audit trail and the resolve form. Everything shown is what the engine
//! answered (`queue`, `inspect`, `resolve`); nothing here judges a record.

use std::fmt::Write as _;

use once::Stats;
use once::types::{Attention, KeySource, OperatorQueue, QueueEntry, RecordView, State};

use crate::html::{age, esc, record_href, time};

/// The queue's filter as the operator typed it (empty fields are unset).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct FilterForm {
    /// Scope.
    #[serde(default)]
    pub scope: String,
    /// Tool.
    #[serde(default)]
    pub tool: String,
    /// Key prefix.
    #[serde(default)]
    pub key: String,
}

/// The queue page.
pub fn queue(queue: &OperatorQueue, stats: &Stats, filter: &FilterForm, limit: u32) -> String {
    let mut b = String::new();
    let _ = write!(
        b,
        "<form method=get action=\"/\"><fieldset><legend>filter</legend>\
         scope <input name=scope value=\"{}\" size=16> tool <input name=tool value=\"{}\" size=16> \
         key starts with <input name=key value=\"{}\" size=24> <button>show</button> <a href=\"/\">clear</a>\
         </fieldset></form>",
        esc(&filter.scope),
        esc(&filter.tool),
        esc(&filter.key)
    );
    b.push_str("<h2>records by state</h2><table id=counts><tr>");
    for state in State::ALL {
        let _ = write!(b, "<th>{}</th>", state.name());
    }
    b.push_str("</tr><tr>");
    for state in State::ALL {
        let n = stats.by_state.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
        let _ = write!(b, "<td data-state=\"{}\">{n}</td>", state.name());
    }
    b.push_str("</tr></table>");
    if queue.truncated {
        let _ = write!(
            b,
            "<p class=bad>The ledger holds more than {limit} pending records: only the first {limit} \
             (earliest due) were examined. Narrow the filter or raise --limit.</p>"
        );
    }
    let now = queue.now;
    section(
        &mut b,
        "approval",
        "Awaiting approval: a person must approve or deny (oldest first)",
        "Nothing more is sent for these until you decide. Open one to see its payload, its attempts so far and its trail, then approve it (its next attempt is sent, never twice) or deny it (it ends, and its spend is released).",
        queue.entries.iter().filter(|e| e.attention == Attention::Approval),
        now,
    );
    section(
        &mut b,
        "unknown",
        "Unknown: the effect may or may not exist (oldest first)",
        "Reconciliation could not settle these. Check the provider, then resolve: confirmed with its receipt, or absent (a dispatch is then owed).",
        queue.entries.iter().filter(|e| e.attention == Attention::Unknown),
        now,
    );
    section(
        &mut b,
        "escalated",
        "Escalated",
        "Past their deadline, delivered to the escalation sink.",
        queue.entries.iter().filter(|e| e.escalated),
        now,
    );
    section(
        &mut b,
        "absent",
        "Absent: a dispatch is owed",
        "Proven not to have happened. The next call or a sending sweep dispatches it; nobody needs to resend by hand.",
        queue.entries.iter().filter(|e| e.attention == Attention::Absent),
        now,
    );
    section(
        &mut b,
        "lease-expired",
        "In flight past its lease",
        "The holder is late or gone. The next sweep or call makes these unknown and reconciles them.",
        queue.entries.iter().filter(|e| e.attention == Attention::LeaseExpired),
        now,
    );
    let _ = write!(b, "<p class=muted>read at {} (ledger clock)</p>", time(now));
    b
}

fn section<'a>(
    b: &mut String,
    id: &str,
    title: &str,
    help: &str,
    entries: impl Iterator<Item = &'a QueueEntry>,
    now: u64,
) {
    let entries: Vec<&QueueEntry> = entries.collect();
    let _ = write!(
        b,
        "<h2 id=\"{id}\">{} <span class=muted>({})</span></h2><p class=muted>{}</p>",
        esc(title),
        entries.len(),
        esc(help)
    );
    if entries.is_empty() {
        b.push_str("<p>nothing</p>");
        return;
    }
    let _ = write!(
        b,
        "<table class=queue data-section=\"{id}\"><tr><th>scope</th><th>key</th><th>tool</th><th>owner</th>\
         <th>state</th><th>since</th><th>age</th><th>deadline</th><th>attempts</th><th>escalated</th><th>reason</th></tr>"
    );
    for e in entries {
        let deadline = e.deadline.map_or("-".to_string(), |d| {
            if d <= now {
                format!("<span class=bad>{} (passed)</span>", time(d))
            } else {
                format!("{} (in {})", time(d), age(d - now))
            }
        });
        let escalated = match (e.escalated, e.escalation_acknowledged) {
            (false, _) => "no",
            (true, true) => "yes, acknowledged",
            (true, false) => "<span class=bad>yes, not acknowledged</span>",
        };
        let dup = if e.possible_duplicate {
            " <span class=bad>possible duplicate</span>"
        } else {
            ""
        };
        let _ = write!(
            b,
            "<tr data-key=\"{k}\"><td>{s}</td><td><a href=\"{href}\">{k}</a>{dup}</td><td>{t}</td><td>{o}</td>\
             <td>{st}</td><td>{since}</td><td>{age}</td><td>{deadline}</td><td>{a}</td><td>{escalated}</td><td>{r}</td></tr>",
            s = esc(&e.scope),
            k = esc(&e.key),
            href = esc(&record_href(&e.scope, &e.key)),
            t = esc(&e.tool),
            o = esc(&e.owner),
            st = e.state.name(),
            since = time(e.since),
            age = age(now.saturating_sub(e.since)),
            a = e.attempts,
            r = esc(e.reason.as_deref().unwrap_or("")),
        );
    }
    b.push_str("</table>");
}

/// What the page says above a record after a resolution, or a refusal.
pub enum Banner {
    /// The engine applied the resolution; the record is now in this state.
    Resolved(State),
    /// The engine (or the form check) refused it, in its own words.
    Refused(String),
}

/// One record's page: its fields, lineage, audit trail and (while something
/// is pending) the resolve form.
pub fn record(view: &RecordView, csrf: &str, banner: Option<&Banner>) -> String {
    let mut b = String::new();
    match banner {
        // An approval or a denial is said as the decision it was (the record's last event).
        Some(Banner::Resolved(state)) => match view.audit.last().map(|e| e.kind.as_str()) {
            Some("approved") => {
                let _ = write!(
                    b,
                    "<p class=ok id=banner>Approved: this exact call may now be sent, once (the record is now \
                     {state}: its dispatch is owed).</p>"
                );
            }
            Some("denied") => {
                let _ = write!(b, "<p class=ok id=banner>Denied: this call will never be sent.</p>");
            }
            _ => {
                let _ = write!(b, "<p class=ok id=banner>Resolved: the record is now {state}.</p>");
            }
        },
        Some(Banner::Refused(why)) => {
            let _ = write!(b, "<p class=bad id=banner>Not resolved: {}</p>", esc(why));
        }
        None => {}
    }
    let link = |key: &Option<String>| {
        key.as_ref().map_or("-".to_string(), |k| {
            format!("<a href=\"{}\">{}</a>", esc(&record_href(&view.scope, k)), esc(k))
        })
    };
    let rows: [(&str, String); 18] = [
        ("scope", esc(&view.scope)),
        (
            "key",
            format!(
                "{} <span class=muted>({})</span>",
                esc(&view.key),
                key_source(view.key_source)
            ),
        ),
        ("tool", esc(&view.tool)),
        (
            "state",
            format!(
                "<b id=state>{}</b>{}",
                view.state,
                if view.escalated { " (escalated)" } else { "" }
            ),
        ),
        ("version", view.version.to_string()),
        ("attempts", view.attempts.to_string()),
        ("args (canonical)", format!("<pre>{}</pre>", esc(&view.args))),
        ("fingerprint", format!("<code>{}</code>", esc(&view.fingerprint))),
        ("provider key", format!("<code>{}</code>", esc(&view.provider_key))),
        ("owner", esc(&view.owner)),
        (
            "receipt",
            view.receipt
                .as_ref()
                .map_or("-".into(), |r| format!("<pre>{}</pre>", esc(r))),
        ),
        ("error", view.error.as_ref().map_or("-".into(), |e| esc(e))),
        (
            "possible duplicate",
            if view.possible_duplicate {
                "<span class=bad>yes: a success arrived while a newer attempt was in flight</span>".into()
            } else {
                "no".into()
            },
        ),
        ("supersedes", link(&view.supersedes)),
        ("superseded by", link(&view.superseded_by)),
        ("replays / conflicts", format!("{} / {}", view.replays, view.conflicts)),
        ("created", time(view.created_at)),
        ("last write", time(view.updated_at)),
    ];
    b.push_str("<table id=record>");
    for (name, value) in rows {
        let _ = write!(b, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    b.push_str("</table>");
    // Offered exactly as the engine says `resolve` would accept it now.
    if view.resolvable.confirmed || view.resolvable.absent || view.resolvable.approve {
        resolve_form(&mut b, view, csrf);
    }
    b.push_str(
        "<h2>audit trail</h2><table id=audit><tr><th>version</th><th>at</th><th>event</th>\
         <th>from</th><th>to</th><th>attempt</th><th>detail</th></tr>",
    );
    for e in &view.audit {
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            e.version,
            time(e.at),
            esc(&e.kind),
            e.from_state.map_or("-", State::name),
            e.to_state.map_or("-", State::name),
            e.attempt.map_or("-".into(), |a| a.to_string()),
            esc(&e.detail)
        );
    }
    b.push_str("</table><details><summary>the engine's whole record (JSON)</summary><pre>");
    b.push_str(&esc(&view.body));
    b.push_str("</pre></details>");
    b
}

fn key_source(source: KeySource) -> &'static str {
    match source {
        KeySource::Application => "the application's key",
        KeySource::Derived => "derived from the args",
    }
}

/// The resolve form, with only the resolutions the engine's `resolvable` names.
fn resolve_form(b: &mut String, view: &RecordView, csrf: &str) {
    let can = &view.resolvable;
    let _ = write!(
        b,
        "<form method=post action=\"/resolve\" id=resolve><fieldset><legend>resolve (audited with your name and note)</legend>\
         <input type=hidden name=csrf value=\"{csrf}\">\
         <input type=hidden name=scope value=\"{s}\"><input type=hidden name=key value=\"{k}\">",
        csrf = esc(csrf),
        s = esc(&view.scope),
        k = esc(&view.key),
    );
    if can.confirmed {
        b.push_str(
            "<p><label><input type=radio name=resolution value=confirmed required> confirmed: the effect happened; its receipt (JSON):</label>\
             <textarea name=receipt rows=3 placeholder='{\"refund_id\":\"r_1\"}'></textarea></p>",
        );
    }
    if can.absent {
        b.push_str(
            "<p><label><input type=radio name=resolution value=absent required> absent: the effect did not happen (a dispatch becomes owed)</label>",
        );
        if can.absent_needs_force {
            b.push_str(
                "<br><label><input type=checkbox name=force value=1> force: an earlier request may still commit \
                 (max_in_flight has not passed since the last dispatch); resolve absent now anyway</label>",
            );
        }
        b.push_str("</p>");
    }
    if can.approve {
        // An owed redispatch may follow an attempt that was sent: the person decides knowing it.
        if view.attempts > 0 {
            let _ = write!(
                b,
                "<p class=bad id=earlier>{} earlier attempt(s) of this operation were granted; the trail below says \
                 what became of each (approving sends the next one, under the same provider key).</p>",
                view.attempts
            );
        }
        b.push_str(
            "<p><label><input type=radio name=resolution value=approve required> approve: send the next attempt of \
             this exact call (the payload above), never twice</label><br><label><input type=radio name=resolution \
             value=deny required> deny: send nothing more (its reserved spend is released)</label></p>",
        );
    }
    b.push_str(
        "<p><label>note (why; required) <input type=text name=note required></label></p>\
         <button>resolve</button></fieldset></form>",
    );
}

/// A page that only says something (not found, refused, signed out).
pub fn message(text: &str) -> String {
    format!("<p id=message>{}</p>", esc(text))
}

/// The sign-in form.
pub fn login(failed: bool) -> String {
    let warn = if failed {
        "<p class=bad id=message>That token opens nothing here.</p>"
    } else {
        ""
    };
    format!(
        "{warn}<p>Paste your operator token (<code>once ui</code> printed it when it started, unless it was given one).</p>\
         <form method=post action=\"/login\"><input type=password name=token autofocus> <button>sign in</button></form>"
    )
}
