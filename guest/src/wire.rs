//! The JSON form of the values that cross as text (see the top of
//! `wit/once.wit`): `protocol`'s calls and steps and `ledger-json`'s batches
//! and rows, which the Python host reads and writes with its JSON parser (the
//! Rust and JavaScript hosts call the typed `driver` and answer the typed
//! `ledger`). wasmtime-py pays for every node of a typed value's type on
//! every crossing; one string costs one node.

use crate::host::CommitError;
use crate::json_out::{Writer, confirmation, effect, key_source, repeat, replay_via, state, table};
use crate::types::{
    Account, Batch, Call, Committed, Ending, Error, Evidence, Got, Grant, Outcome, Reading, Step, Stored,
};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// A `call` from its JSON form.
pub fn call(text: &str) -> Result<Call, Error> {
    serde_json::from_str(text).map_err(|e| Error::InvalidRequest(format!("call: not the JSON form of a call: {e}")))
}

/// An `option<call>` from its JSON form (`null`: none).
pub fn optional_call(text: &str) -> Result<Option<Call>, Error> {
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidRequest(format!("call: not the JSON form of an option<call>: {e}")))
}

/// A `reading` from its JSON form.
pub fn reading(text: &str) -> Result<Reading, Error> {
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidRequest(format!("reading: not the JSON form of a reading: {e}")))
}

/// An `evidence` from its JSON form.
pub fn evidence(text: &str) -> Result<Evidence, Error> {
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidRequest(format!("evidence: not the JSON form of an evidence: {e}")))
}

/// An `outcome` from its JSON form.
pub fn outcome(text: &str) -> Result<Outcome, Error> {
    serde_json::from_str(text)
        .map_err(|e| Error::InvalidRequest(format!("outcome: not the JSON form of an outcome: {e}")))
}

/// `ledger-json.get`'s answer, from its JSON form: the row's version and body, or
/// none. Text that is not a `got` is the store's failure, in words.
pub fn got(text: &str) -> Result<Option<Stored>, String> {
    match serde_json::from_str(text) {
        Ok(got) => read(got),
        Err(e) => Err(format!(
            "ledger-json.get: the host's answer is not the JSON form of a got: {e}"
        )),
    }
}

/// `ledger-json.commit`'s answer, from its JSON form. Text that is not a
/// `committed` leaves the batch's fate unknown: a storage failure.
pub fn committed(text: &str) -> Result<(), CommitError> {
    // The two answers of nearly every commit, without a parser.
    match text {
        "\"Applied\"" => return Ok(()),
        "\"Conflict\"" => return Err(CommitError::Conflict),
        _ => {}
    }
    match serde_json::from_str(text) {
        Ok(c) => applied(c),
        Err(e) => Err(CommitError::Storage(format!(
            "ledger-json.commit: the host's answer is not the JSON form of a committed: {e}"
        ))),
    }
}

/// `ledger.get`'s answer (either encoding): the row's version and body, none, or the store's words.
pub fn read(got: Got) -> Result<Option<Stored>, String> {
    match got {
        Got::Found(stored) => Ok(Some(stored)),
        Got::Missing => Ok(None),
        Got::Failed(f) => Err(f.message),
    }
}

/// `ledger.commit`'s answer (either encoding).
pub fn applied(committed: Committed) -> Result<(), CommitError> {
    match committed {
        Committed::Applied => Ok(()),
        Committed::Conflict => Err(CommitError::Conflict),
        Committed::Failed(f) => Err(CommitError::Storage(f.message)),
    }
}

/// The JSON form of a protocol export's answer. The answers of a protected
/// call that goes well (a grant, a confirmed account) are written by hand,
/// every other one by serde; the tests hold both to the same bytes.
pub fn step(answer: &Result<Step, Error>) -> String {
    match answer {
        Ok(Step::Dispatch(grant)) => dispatch_json(grant),
        Ok(Step::Done(account)) if matches!(account.ending, Ending::Confirmed(_)) => confirmed_json(account),
        // Every field is a string, an integer, a bool or a container of them: nothing fails to serialize.
        _ => serde_json::to_string(answer).unwrap_or_default(),
    }
}

fn dispatch_json(g: &Grant) -> String {
    let mut w = Writer::with_capacity(256 + g.args.len());
    w.0.push_str("{\"Ok\":{\"Dispatch\":{");
    w.str("scope", &g.scope);
    w.str("key", &g.key);
    w.str("tool", &g.tool);
    w.num("attempt", u64::from(g.attempt));
    w.str("fence", &g.fence);
    w.str("provider_key", &g.provider_key);
    w.str("args", &g.args);
    w.num("lease_until", g.lease_until);
    w.num("send_by", g.send_by);
    w.num("timeout_ms", g.timeout_ms);
    w.0.push_str("}}}");
    w.0
}

fn confirmed_json(a: &Account) -> String {
    let Ending::Confirmed(c) = &a.ending else {
        return serde_json::to_string(&Ok::<_, Error>(Step::Done(a.clone()))).unwrap_or_default();
    };
    let mut w = Writer::with_capacity(320 + c.receipt.len());
    w.0.push_str("{\"Ok\":{\"Done\":{");
    w.str("scope", &a.scope);
    w.opt_str("key", a.key.as_deref());
    w.raw("key_source", a.key_source.map_or("null", key_source));
    w.str("tool", &a.tool);
    w.key("ending");
    w.0.push_str("{\"Confirmed\":{");
    w.str("receipt", &c.receipt);
    w.bool("replayed", c.replayed);
    w.raw("via", c.via.map_or("null", replay_via));
    w.raw("confirmed_by", confirmation(c.confirmed_by));
    w.num("at", c.at);
    w.opt_num("window_until", c.window_until);
    w.opt_num("attempt", c.attempt.map(u64::from));
    w.raw("earlier_attempts", effect(c.earlier_attempts));
    w.bool("possible_duplicate", c.possible_duplicate);
    w.0.push_str("}}");
    w.raw("effect", effect(a.effect));
    w.raw("repeat", repeat(a.repeat));
    w.bool("awaits_operator", a.awaits_operator);
    w.0.push_str("}}}");
    w.0
}

/// `ledger-json.commit`'s arguments for `batch`: the JSON form of its `batch-head`,
/// and the bodies of the rows it writes, in put order.
pub fn batch(batch: &Batch) -> (String, Vec<String>) {
    let mut w = Writer::with_capacity(160 * (batch.puts.len() + batch.events.len()) + 32);
    w.0.push('{');
    w.key("puts");
    w.list(&batch.puts, |w, p| {
        w.0.push('{');
        w.raw("table", table(p.table));
        w.str("scope", &p.scope);
        w.str("key", &p.key);
        w.opt_num("expected", p.expected);
        w.key("row");
        match &p.row {
            None => w.0.push_str("null"),
            Some(r) => {
                w.0.push('{');
                w.num("version", r.version);
                w.raw("state", r.state.map_or("null", state));
                w.opt_num("due_at", r.due_at);
                w.opt_str("owner", r.owner.as_deref());
                w.0.push('}');
            }
        }
        w.0.push('}');
    });
    w.key("events");
    w.list(&batch.events, |w, e| {
        w.0.push('{');
        w.str("scope", &e.scope);
        w.str("key", &e.key);
        w.num("version", e.version);
        w.num("at", e.at);
        w.str("kind", &e.kind);
        w.raw("from_state", e.from_state.map_or("null", state));
        w.raw("to_state", e.to_state.map_or("null", state));
        w.opt_num("attempt", e.attempt.map(u64::from));
        w.str("detail", &e.detail);
        w.0.push('}');
    });
    w.bool("deferrable", batch.deferrable);
    w.0.push('}');
    // wit-bindgen passes a `list<string>` import argument as `&[String]`.
    let bodies = batch
        .puts
        .iter()
        .filter_map(|p| p.row.as_ref())
        .map(|r| r.body.clone())
        .collect();
    (w.0, bodies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AuditEvent, BlockReason, Blocked, Confirmation, Grant, Put, Row, State, Table};
    use alloc::string::ToString;
    use alloc::vec;

    fn sample() -> Batch {
        let row = |table, key: &str, state, owner: Option<&str>, body: &str| Row {
            table,
            scope: "tenant \"a\"".into(),
            key: key.into(),
            version: 3,
            state,
            due_at: Some(1_796_270_772_538),
            owner: owner.map(ToString::to_string),
            body: body.into(),
        };
        Batch {
            puts: vec![
                Put {
                    table: Table::Operation,
                    scope: "tenant \"a\"".into(),
                    key: "k\u{e9}".into(),
                    expected: Some(2),
                    row: Some(row(
                        Table::Operation,
                        "k\u{e9}",
                        Some(State::InFlight),
                        Some("gw"),
                        "{\"a\":1}",
                    )),
                },
                Put {
                    table: Table::Tombstone,
                    scope: "tenant \"a\"".into(),
                    key: "k\u{e9}".into(),
                    expected: None,
                    row: None,
                },
                Put {
                    table: Table::Quota,
                    scope: "tenant \"a\"".into(),
                    key: "refund@0".into(),
                    expected: None,
                    row: Some(row(Table::Quota, "refund@0", None, None, "{\"used\":\"5\"}")),
                },
            ],
            events: vec![AuditEvent {
                scope: "tenant \"a\"".into(),
                key: "k\u{e9}".into(),
                version: 3,
                at: 7,
                kind: "begin".into(),
                from_state: None,
                to_state: Some(State::InFlight),
                attempt: Some(1),
                detail: "{\"lease_until\":9}".into(),
            }],
            deferrable: true,
        }
    }

    /// The generated `batch-head` of `b`: what the host decodes `batch(b)`'s text into.
    fn head(b: &Batch) -> crate::types::BatchHead {
        crate::types::BatchHead {
            puts: b
                .puts
                .iter()
                .map(|p| crate::types::PutHead {
                    table: p.table,
                    scope: p.scope.clone(),
                    key: p.key.clone(),
                    expected: p.expected,
                    row: p.row.as_ref().map(|r| crate::types::RowHead {
                        version: r.version,
                        state: r.state,
                        due_at: r.due_at,
                        owner: r.owner.clone(),
                    }),
                })
                .collect(),
            events: b.events.clone(),
            deferrable: b.deferrable,
        }
    }

    #[test]
    fn a_batch_head_is_the_json_form_of_the_generated_type() {
        let batch = sample();
        let (text, bodies) = super::batch(&batch);
        let generated = head(&batch);
        assert_eq!(text, serde_json::to_string(&generated).unwrap());
        assert_eq!(bodies, ["{\"a\":1}", "{\"used\":\"5\"}"]);
        // What a host reads back is the batch itself.
        let read: crate::types::BatchHead = serde_json::from_str(&text).unwrap();
        assert_eq!(read, generated);
    }

    #[test]
    fn steps_and_errors_cross_in_the_json_form() {
        let grant = Step::Dispatch(Grant {
            scope: "s".into(),
            key: "k".into(),
            tool: "refund".into(),
            attempt: 1,
            fence: "1-ab".into(),
            provider_key: "once-cd".into(),
            args: "{\"amount\":\"5.00\"}".into(),
            lease_until: 10,
            send_by: 9,
            timeout_ms: 5,
        });
        let text = step(&Ok(grant.clone()));
        assert!(text.starts_with("{\"Ok\":{\"Dispatch\":{\"scope\":\"s\""), "{text}");
        assert_eq!(serde_json::from_str::<Result<Step, Error>>(&text).unwrap(), Ok(grant));
        let blocked = Ok(Step::Done(crate::types::Account {
            scope: "s".into(),
            key: None,
            key_source: None,
            tool: "t".into(),
            ending: crate::types::Ending::Blocked(Blocked {
                reason: BlockReason::RouteBlocked,
                detail: "no".into(),
                receipt: None,
            }),
            effect: crate::types::Effect::None,
            repeat: crate::types::Repeat::Refused,
            awaits_operator: false,
        }));
        assert_eq!(
            serde_json::from_str::<Result<Step, Error>>(&step(&blocked)).unwrap(),
            blocked
        );
        assert_eq!(step(&Ok(Step::Direct)), "{\"Ok\":\"Direct\"}");
        assert_eq!(step(&Err(Error::NotConfigured)), "{\"Err\":\"NotConfigured\"}");
    }

    /// Every hand-written answer is byte-for-byte what serde writes.
    #[test]
    fn hand_written_answers_are_serdes_bytes() {
        use crate::types::{ConfirmedInfo, Effect, Ending, KeySource, Repeat, ReplayVia};
        let grant = |args: &str, attempt| Grant {
            scope: "t\u{e9}nant \"q\"\n".into(),
            key: "k\\1".into(),
            tool: "refund".into(),
            attempt,
            fence: "2-00ff".into(),
            provider_key: "once-ab".into(),
            args: args.into(),
            lease_until: u64::MAX,
            send_by: 0,
            timeout_ms: 30_000,
        };
        let mut steps = vec![
            Step::Dispatch(grant("{\"amount\":\"5.00\",\"note\":\"\\u0001\"}", 1)),
            Step::Dispatch(grant("[]", u32::MAX)),
        ];
        let vias = [
            None,
            Some(ReplayVia::Key),
            Some(ReplayVia::DerivedArgs),
            Some(ReplayVia::Provider),
        ];
        let bys = [Confirmation::Answer, Confirmation::Provider, Confirmation::Operator];
        let effects = [Effect::Happened, Effect::None, Effect::Unknown];
        let repeats = [Repeat::Replays, Repeat::Waits, Repeat::Retries, Repeat::Refused];
        for (i, via) in vias.into_iter().enumerate() {
            for (j, confirmed_by) in bys.into_iter().enumerate() {
                let n = i * 3 + j;
                steps.push(Step::Done(Account {
                    scope: "s".into(),
                    key: (n % 2 == 0).then(|| "k\u{1F600}".into()),
                    key_source: [None, Some(KeySource::Application), Some(KeySource::Derived)][n % 3],
                    tool: "t".into(),
                    ending: Ending::Confirmed(ConfirmedInfo {
                        receipt: "{\"id\":\"r\\t1\"}".into(),
                        replayed: n % 2 == 1,
                        via,
                        confirmed_by,
                        at: n as u64,
                        window_until: (n % 3 == 0).then_some(u64::MAX),
                        attempt: (n % 4 != 0).then_some(n as u32),
                        earlier_attempts: effects[n % 3],
                        possible_duplicate: n % 5 == 0,
                    }),
                    effect: effects[(n + 1) % 3],
                    repeat: repeats[n % 4],
                    awaits_operator: n % 2 == 0,
                }));
            }
        }
        for step in steps {
            let answer = Ok(step);
            assert_eq!(super::step(&answer), serde_json::to_string(&answer).unwrap());
        }
        // Batches: every table, state, option and the flag.
        let mut batch = sample();
        batch.deferrable = false;
        for (i, s) in [
            None,
            Some(State::Confirmed),
            Some(State::Failed),
            Some(State::Unknown),
            Some(State::Absent),
            Some(State::Superseded),
        ]
        .into_iter()
        .enumerate()
        {
            batch.events.push(AuditEvent {
                scope: "s".into(),
                key: "\u{7f}k".into(),
                version: i as u64,
                at: u64::MAX,
                kind: "k".into(),
                from_state: s,
                to_state: None,
                attempt: None,
                detail: "{}".into(),
            });
        }
        assert_eq!(super::batch(&batch).0, serde_json::to_string(&head(&batch)).unwrap());
    }

    #[test]
    fn the_ledgers_answers_are_read_from_their_json_form() {
        let found = Got::Found(Stored {
            version: 7,
            body: "{\"a\":\"\\\"q\\\"\"}".into(),
        });
        let stored = got(&serde_json::to_string(&found).unwrap()).unwrap().unwrap();
        assert_eq!((stored.version, stored.body.as_str()), (7, "{\"a\":\"\\\"q\\\"\"}"));
        assert_eq!(got("\"Missing\""), Ok(None));
        assert_eq!(got("{\"Failed\":{\"message\":\"disk\"}}"), Err("disk".into()));
        assert!(
            got("{\"Found\":1}")
                .unwrap_err()
                .starts_with("ledger-json.get: the host's answer is not")
        );
        for c in [
            Committed::Applied,
            Committed::Conflict,
            Committed::Failed(crate::types::Failure { message: "x".into() }),
        ] {
            let expected = match &c {
                Committed::Applied => Ok(()),
                Committed::Conflict => Err(CommitError::Conflict),
                Committed::Failed(f) => Err(CommitError::Storage(f.message.clone())),
            };
            assert_eq!(committed(&serde_json::to_string(&c).unwrap()), expected);
        }
        // Anything else leaves the batch's fate unknown: never taken for applied.
        assert!(matches!(committed("applied"), Err(CommitError::Storage(_))));
        assert!(matches!(committed(" \"Applied\""), Ok(())));
    }

    #[test]
    fn malformed_text_is_an_invalid_request_that_says_what() {
        let Err(Error::InvalidRequest(why)) = call("{\"scope\":1}") else {
            panic!("accepted");
        };
        assert!(why.starts_with("call: not the JSON form of a call"), "{why}");
        assert!(matches!(outcome("\"Maybe\""), Err(Error::InvalidRequest(_))));
        assert_eq!(outcome("\"NotSent\""), Ok(Outcome::NotSent));
        assert_eq!(
            outcome("{\"Success\":\"{\\\"id\\\":1}\"}"),
            Ok(Outcome::Success("{\"id\":1}".into()))
        );
    }
}
