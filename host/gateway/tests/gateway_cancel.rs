//! A client's cancellation through `once gateway` (real gateway and refund-mcp
//! processes, an rmcp client): a protected call cancelled after it was sent is
//! never reported or recorded as a rejection — the record goes unknown and
//! reconciliation settles it from the provider; one refund.

mod gateway_common;

use std::time::Duration;

use gateway_common::{Rig, meta, object, outcome, send_call, text, wait_for};
use once::Once;
use once::types::State;
use refund::ORDER_ID;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

/// A long timeout, so only the client's cancellation can end the wait; `late_reply` commits the
/// refund and answers 3 s later.
const CONFIG: &str = r#"sweep_interval = "50ms"

[tools.refund_order]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"
timeout = "20s"
max_in_flight = "1s"
reconcile_interval = "100ms"
reconcile = "required"
lookup = { tool = "find_refund_by_key", args = { idempotency_key = "{key}" }, found = "/found", receipt = "/refund", read_position = "/read_position" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_call_cancelled_after_dispatch_is_unknown_then_reconciled_never_rejected() {
    let rig = Rig::new(CONFIG);
    let session = rig.connect("late_reply", 0).await;
    let mut params =
        CallToolRequestParams::new("refund_order").with_arguments(object(json!({"order_id": ORDER_ID, "amount": 200})));
    params.meta = Some(meta(&[("once/key", "cancel-1")]));
    let handle = send_call(session.client.peer(), params).await;
    // Dispatched: the refund is in the effect ledger, its reply is still 3 s away.
    wait_for("the refund to commit", Duration::from_secs(10), || rig.effects().0 == 1).await;
    handle.cancel(Some("the agent gave up".to_string())).await.unwrap();

    // The same operation again: once answers from the provider's read, it never sends a second refund.
    let again = session.refund(200.0, Some("cancel-1")).await;
    let t = text(&again);
    assert_ne!(again.is_error, Some(true), "{t}\n{}", rig.logs());
    assert!(t.starts_with("Replay of operation cancel-1:"), "{t}");
    assert!(t.contains("once confirmed it by reading find_refund_by_key"), "{t}");
    assert_eq!(outcome(&again)["effect"], "happened");
    let status = session.close().await;
    assert!(status.success(), "gateway exit {status}\n{}", rig.logs());
    assert_eq!(rig.effects(), (1, 20_000), "exactly one refund\n{}", rig.logs());

    let once = Once::open(&rig.db).unwrap().build().unwrap();
    let view = once
        .inspect("default", "cancel-1")
        .unwrap()
        .expect("the operation is recorded");
    assert_eq!(view.state, State::Confirmed);
    let trail: Vec<String> = view
        .audit
        .iter()
        .map(|e| format!("{} -> {:?}: {}", e.kind, e.to_state, e.detail))
        .collect();
    let reached = |s: State| view.audit.iter().any(|e| e.to_state == Some(s));
    assert!(reached(State::InFlight), "{trail:#?}");
    assert!(
        reached(State::Unknown),
        "the cancelled attempt went unknown: {trail:#?}"
    );
    assert!(
        !reached(State::Failed),
        "a cancellation is never a rejection: {trail:#?}"
    );
    assert!(
        trail
            .iter()
            .any(|e| e.contains("the client cancelled the call after it was sent")),
        "{trail:#?}"
    );
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
}
