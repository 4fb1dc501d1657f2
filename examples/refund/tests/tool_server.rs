//! The second study's tool server: what each dedupe and fault writes, read back from its own tables.

use std::time::Duration;

use refund::CallError;
use refund::tool_server::{Dedupe, ToolClient, ToolFault, ToolServer, ToolServerOptions, ToolTables};
use tempfile::TempDir;

const ARGS: &str = r#"{"amount":200,"order_id":1234}"#;

struct Fixture {
    server: ToolServer,
    _dir: TempDir,
}

impl Fixture {
    fn new(dedupe: Dedupe, fault: ToolFault) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let server =
            ToolServer::start(dir.path().join("tool.db"), dedupe, fault, ToolServerOptions::default()).unwrap();
        Fixture { server, _dir: dir }
    }

    /// A client that waits out any stall, so each answer is the server's own.
    fn patient(&self) -> ToolClient {
        ToolClient::new(self.server.base_url(), Duration::from_secs(5))
    }

    fn tables(&self) -> ToolTables {
        ToolTables::open(self.server.db_path()).unwrap()
    }
}

fn body(call_id: &str, args: &str) -> String {
    format!(r#"{{"tool":"refund_order","call_id":"{call_id}","args":{args}}}"#)
}

#[test]
fn key_dedupe_answers_a_known_key_from_the_responses_table() {
    let f = Fixture::new(Dedupe::Key, ToolFault::None);
    let c = f.patient();
    let first = c.call(&body("call-1", ARGS), "k-1").unwrap();
    assert_eq!(
        c.call(&body("call-2", ARGS), "k-1").unwrap(),
        first,
        "the same key replays"
    );
    let fresh = c.call(&body("call-3", ARGS), "k-2").unwrap();
    assert_ne!(fresh, first, "a new key is a new effect under key dedupe");
    let conflict = c.call(&body("call-4", r#"{"amount":300,"order_id":1234}"#), "k-1");
    assert!(
        matches!(conflict, Err(CallError::Rejected { status: 409, .. })),
        "{conflict:?}"
    );
    let t = f.tables();
    assert_eq!(t.effects().unwrap(), 2);
    let requests = t.requests().unwrap();
    assert_eq!(requests.len(), 4, "every request is logged, whatever it did");
    assert_eq!(requests[0].call_id.as_deref(), Some("call-1"));
    assert_eq!(requests[0].idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(requests[0].chars, body("call-1", ARGS).len() as u64);
}

#[test]
fn args_dedupe_answers_the_same_arguments_under_any_key() {
    let f = Fixture::new(Dedupe::Args, ToolFault::None);
    let c = f.patient();
    let first = c.call(&body("call-1", ARGS), "k-1").unwrap();
    assert_eq!(c.call(&body("call-1", ARGS), "k-2").unwrap(), first);
    c.call(&body("call-1", r#"{"amount":100,"order_id":1234}"#), "k-3")
        .unwrap();
    assert_eq!(f.tables().effects().unwrap(), 2);
}

#[test]
fn the_lookup_finds_the_effect_under_its_key_as_it_was_answered() {
    let f = Fixture::new(Dedupe::Key, ToolFault::None);
    let c = f.patient();
    let before = c.find_effect("k-1").unwrap();
    assert_eq!(before.receipt, None);
    let receipt = c.call(&body("call-1", ARGS), "k-1").unwrap();
    let after = c.find_effect("k-1").unwrap();
    assert_eq!(after.receipt.as_deref(), Some(receipt.as_str()));
    assert!(after.read_position >= before.read_position);
}

#[test]
fn a_stall_before_the_commit_writes_nothing_and_never_answers() {
    let f = Fixture::new(Dedupe::Key, ToolFault::PreCommitStall);
    let c = f.patient();
    for key in ["k-1", "k-2"] {
        let r = c.call(&body("call-1", ARGS), key);
        assert!(matches!(r, Err(CallError::Ambiguous(_))), "{r:?}");
    }
    let t = f.tables();
    assert_eq!(t.effects().unwrap(), 0);
    assert_eq!(t.requests().unwrap().len(), 2, "both reached the server");
    assert_eq!(c.find_effect("k-1").unwrap().receipt, None);
}

#[test]
fn a_stall_after_the_commit_delays_only_the_first_reply() {
    let f = Fixture::new(Dedupe::Key, ToolFault::PostCommitStall);
    // Shorter than the stall: the first reply is lost to the client, its effect is not.
    let hasty = ToolClient::new(f.server.base_url(), Duration::from_millis(100));
    let lost = hasty.call(&body("call-1", ARGS), "k-1");
    assert!(matches!(lost, Err(CallError::Ambiguous(_))), "{lost:?}");
    let found = f.patient().find_effect("k-1").unwrap();
    assert!(found.receipt.is_some(), "committed before the stall");
    // Same key: the stored response, with no stall and no second effect.
    let again = f.patient().call(&body("call-1", ARGS), "k-1").unwrap();
    assert_eq!(Some(again), found.receipt);
    assert_eq!(f.tables().effects().unwrap(), 1);
}

#[test]
fn a_502_that_never_resolves_writes_nothing() {
    let f = Fixture::new(Dedupe::Args, ToolFault::Reject502);
    let c = f.patient();
    for _ in 0..3 {
        let r = c.call(&body("call-1", ARGS), "k-1");
        assert!(
            matches!(r, Err(CallError::Ambiguous(ref why)) if why.contains("502")),
            "{r:?}"
        );
    }
    assert_eq!(f.tables().effects().unwrap(), 0);
    assert_eq!(f.tables().requests().unwrap().len(), 3);
}

#[test]
fn bad_requests_are_refused_and_still_logged() {
    let f = Fixture::new(Dedupe::Key, ToolFault::None);
    let c = f.patient();
    let r = c.call("not json", "k-1");
    assert!(matches!(r, Err(CallError::Rejected { status: 400, .. })), "{r:?}");
    let r = c.call(&body("call-1", ARGS), "");
    assert!(matches!(r, Err(CallError::Rejected { status: 400, .. })), "{r:?}");
    let t = f.tables();
    assert_eq!(t.effects().unwrap(), 0);
    let requests = t.requests().unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].call_id, None);
    assert!("not json".parse::<ToolFault>().is_err());
    assert_eq!("reject_502".parse::<ToolFault>().unwrap(), ToolFault::Reject502);
}
