//! `once gateway` end to end with real processes: an rmcp client → the
//! `once gateway` binary → the `refund-mcp` example server (its own refund
//! service and SQLite effect ledger), under the demo's faults. Every verdict
//! is read from the effect ledger; every text is what a model would be shown.

mod gateway_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gateway_common::*;
use refund::ORDER_ID;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, Tool};
use serde_json::{Value, json};

// ---- acceptance: a never-retry agent behind the shipped config gets exactly one refund ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_pre_effect_disconnect() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let result = never_retry(&rig, "pre_effect_disconnect").await;
    // The lost request can commit for max_in_flight (3 s), inside the call's wait: the call reads the
    // provider then, finds no refund, and sends the owed one itself, with the same key.
    assert_sent_again(&rig, &result, 2);
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_stops_waiting_is_told_unknown_and_the_gateway_settles_it() {
    // Told not to wait, the call answers what is known at once; the agent never calls again, and the
    // gateway's worker proves the refund absent and sends it itself, with the same key.
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let result = never_retry(&rig, "pre_effect_disconnect").await;
    assert_unknown_text(&result, "the upstream closed the connection before replying");
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_post_commit_disconnect() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let result = never_retry(&rig, "post_commit_disconnect").await;
    assert_confirmed_by_lookup(&rig, &result);
    assert_exactly_one_refund(&rig);
}

// ---- the rest of the demo's faults ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_without_a_fault_sees_the_upstream_result() {
    let rig = Rig::new(&fast_config(""));
    let result = never_retry(&rig, "none").await;
    assert_ne!(result.is_error, Some(true));
    // The upstream's own result, untouched, with once's account in _meta.
    let receipt: Value = serde_json::from_str(&text(&result)).unwrap();
    assert_eq!(receipt["amount"], json!(200.0));
    assert!(
        receipt["idempotency_key"].as_str().unwrap().starts_with("once-"),
        "{receipt}"
    );
    assert_eq!(result.structured_content.as_ref().unwrap(), &receipt);
    assert_eq!(outcome(&result)["decision"], "executed");
    assert_eq!(outcome(&result)["attempt"], 1);
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_reject_502() {
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let result = never_retry(&rig, "reject_502").await;
    assert_unknown_text(&result, "the upstream answered a protocol error");
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_under_a_key_from_meta_says_to_call_again_with_that_key() {
    // With the key in _meta, the same arguments without it would be a different (derived) operation:
    // the model must be told to reuse the key, not the arguments.
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let session = rig.connect("reject_502", 0).await;
    let result = session.refund(200.0, Some("refund-1234-u")).await;
    assert!(session.close().await.success());
    let t = text(&result);
    assert!(t.starts_with("UNKNOWN: refund_order (operation refund-1234-u)"), "{t}");
    assert!(
        t.contains(
            r#"Calling refund_order again with operation key refund-1234-u in _meta "once/key" will not send it again"#
        ),
        "{t}"
    );
    assert!(!t.contains("same arguments"), "{t}");
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_params_from_the_upstream_is_a_rejection() {
    // JSON-RPC's "invalid params" is answered before the tool runs: nothing happened, so the record is
    // failed (not unknown) and nothing is reconciled or redispatched.
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let result = session
        .call(
            "refund_order",
            json!({"order_id": [ORDER_ID], "amount": 50}),
            Some("refund-bad-args"),
        )
        .await;
    assert!(session.close().await.success());
    let t = text(&result);
    assert_eq!(result.is_error, Some(true), "{t}");
    assert!(
        t.starts_with("Rejected: the upstream refused refund_order (operation refund-bad-args) and did nothing."),
        "{t}"
    );
    assert!(t.contains("The upstream said: bad arguments"), "{t}");
    assert_eq!(outcome(&result)["decision"], "rejected");
    let trail = rig.audit(&result);
    assert!(trail.iter().any(|e| e.starts_with("finish-rejected")), "{trail:#?}");
    assert_eq!(rig.effects(), (0, 0), "no refund\n{}", rig.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_late_reply() {
    // The background reconciler stays out of the way (as under stale_read): this is the call's own read. When
    // the reconciler reads first, the call is answered from its confirmation instead (a different text).
    let rig = Rig::new(&config_with_sweep("3s", ""));
    let result = never_retry(&rig, "late_reply").await;
    // The 1 s timeout ends the wait; the lookup finds the committed refund.
    assert_confirmed_by_lookup(&rig, &result);
    assert_exactly_one_refund(&rig);
}

/// The gateway waits for a protected dispatch's answer until the engine's deadline, send-by plus the
/// timeout (inside the lease), as every host stops its sender there, not for the timeout from the send:
/// a reply after the timeout but before that deadline is the call's own answer, not a lost reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_after_the_timeout_but_before_the_engines_deadline_is_the_answer() {
    // A 2 s timeout in a 5 s lease: send-by is 3 s after the grant, and the answer is due 5 s after it. The
    // reply comes 2.6 s after the refund commits: past the timeout, and well before the deadline.
    let config = config_with_sweep("3s", "").replace(r#"timeout = "1s""#, "timeout = \"2s\"\nlease = \"5s\"");
    let rig = Rig::new(&config);
    let mut command = rig.gateway_command("late_reply");
    command.args(["--late-reply-ms", "2600"]);
    let session = rig.connect_command(command, 0).await;
    let result = session.refund(200.0, None).await;
    let status = session.close().await;
    assert!(status.success(), "gateway exit {status}\n{}", rig.logs());
    assert_eq!(
        outcome(&result)["decision"],
        "executed",
        "{}\n{}",
        text(&result),
        rig.logs()
    );
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_stale_read() {
    // The background reconciler stays out of the way, so the call's own reads are the ones in the trail (a
    // concurrent read could win the ledger's compare-and-swap and leave the stale one unrecorded).
    let rig = Rig::new(&config_with_sweep("3s", ""));
    let result = never_retry(&rig, "stale_read").await;
    // The reply is lost and the call's first read comes from before the write: it must not count as absent,
    // so nothing is sent; the call's next read, once due, finds the refund.
    assert_confirmed_by_lookup(&rig, &result);
    let trail = rig.audit(&result);
    assert!(
        trail.iter().any(|d| d.contains("not after the last dispatch")),
        "the stale read is in the audit trail and did not count: {trail:#?}\n{}",
        rig.logs()
    );
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_dispatch_is_finished_by_the_next_one() {
    // A fixed scope: the restarted agent and gateway continue the same operation.
    let rig = Rig::new(&fast_config(r#"scope = "fixed:desk-7""#));
    let first = rig.connect("crash_after_dispatch", 0).await;
    // The call stays open until the kill: a client that hung up first would make the gateway
    // record it as ambiguous itself, and the next gateway would find nothing left in flight.
    let mut params = CallToolRequestParams::new("refund_order")
        .with_arguments(object(json!({"order_id": ORDER_ID, "amount": 200.0})));
    params.meta = Some(meta(&[("once/key", "refund-1234-a")]));
    let open = send_call(first.client.peer(), params).await;
    wait_for("the refund to commit", Duration::from_secs(20), || rig.effects().0 == 1).await;
    // SIGKILL: the gateway sent the refund and dies before it hears back.
    first.kill().await;
    drop(open);

    // The same gateway command again, as a supervisor restarts it (the fault fires once per ledger).
    let second = rig.connect("crash_after_dispatch", 1).await;
    let result = second.refund(200.0, Some("refund-1234-a")).await;
    let t = text(&result);
    assert!(
        t.starts_with("Replay of operation refund-1234-a:"),
        "{t}\n{}",
        rig.logs()
    );
    assert!(t.contains("Nothing was sent again"), "{t}");
    assert!(second.close().await.success());
    let trail = rig.audit(&result);
    assert!(
        trail.iter().any(|e| e.starts_with("lease-expired")),
        "the killed gateway left it in flight: {trail:#?}"
    );
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_make_one_refund() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("concurrent_duplicate", 0).await;
    let (a, b) = tokio::join!(
        session.refund(200.0, Some("refund-1234-c")),
        session.refund(200.0, Some("refund-1234-c"))
    );
    let decisions = [outcome(&a)["decision"].clone(), outcome(&b)["decision"].clone()];
    assert!(
        decisions.contains(&json!("executed")) && decisions.contains(&json!("replayed")),
        "{decisions:?}\n{}\n{}",
        text(&a),
        text(&b)
    );
    let replay = if outcome(&a)["decision"] == "replayed" { &a } else { &b };
    assert!(
        text(replay).starts_with("Replay of operation refund-1234-c:"),
        "{}",
        text(replay)
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

// ---- what the model is shown ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_conflict_and_two_disagreeing_keys() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let first = session.refund(200.0, Some("refund-1234-r")).await;
    assert_eq!(outcome(&first)["decision"], "executed", "{}", text(&first));

    let again = session.refund(200.0, Some("refund-1234-r")).await;
    let t = text(&again);
    assert!(
        t.starts_with(
            "Replay of operation refund-1234-r: refund_order already ran under this operation key; below is its \
             stored result. Nothing was sent again."
        ),
        "{t}"
    );
    assert_eq!(again.is_error, Some(false));
    // The stored result follows the note, with its structured content.
    assert_eq!(again.content.len(), 2);
    assert_eq!(again.structured_content.as_ref().unwrap()["refund_id"], json!(1));
    assert_eq!(outcome(&again)["via"], "key");

    let changed = session.refund(250.0, Some("refund-1234-r")).await;
    let t = text(&changed);
    assert_eq!(changed.is_error, Some(true));
    assert!(
        t.starts_with("CONFLICT: operation key refund-1234-r was already used for a different call"),
        "{t}"
    );
    assert!(
        t.contains(r#"refund_order({"amount":200,"#) && t.contains("state confirmed"),
        "{t}"
    );
    assert!(t.contains("This refund_order call was NOT sent"), "{t}");
    let stored = &changed.structured_content.as_ref().unwrap()["once"]["stored"];
    assert_eq!(stored["args"]["amount"], json!(200));

    // Two application carriers that disagree: blocked, never a guess.
    let mut params =
        CallToolRequestParams::new("refund_order").with_arguments(object(json!({"order_id": ORDER_ID, "amount": 5})));
    params.meta = Some(meta(&[("once/key", "refund-a"), ("idempotencyKey", "refund-b")]));
    let conflicted = session.client.call_tool(params).await.unwrap();
    let t = text(&conflicted);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: the call carries two different operation keys"),
        "{t}"
    );
    assert!(t.contains("identity-conflict"), "{t}");

    // Without a key, the same arguments twice are one operation (derived from the arguments), and say so.
    let derived = session.refund(20.0, None).await;
    assert_eq!(outcome(&derived)["decision"], "executed");
    let derived_again = session.refund(20.0, None).await;
    let t = text(&derived_again);
    assert!(
        t.starts_with("Replay: a refund_order call with the same order_id and amount already ran at "),
        "{t}"
    );
    assert!(t.contains(" as operation derived:"), "{t}");
    assert!(
        t.contains(r#"For a deliberate second refund_order with the same order_id and amount, give it its own operation key in _meta "once/key"."#),
        "{t}"
    );
    assert!(
        t.contains("calls with the same order_id and amount are this same operation; after that they are new"),
        "{t}"
    );
    assert_eq!(
        outcome(&derived_again)["identity_fields"],
        json!(["/order_id", "/amount"])
    );
    assert_eq!(outcome(&derived_again)["via"], "derived-args");
    assert!(outcome(&derived_again)["window_until"].as_u64().is_some());
    assert!(session.close().await.success());
    assert_eq!(
        rig.effects(),
        (2, 22_000),
        "one $200 and one $20 refund\n{}",
        rig.logs()
    );
}

/// A model that retries an unknown outcome rewording what is not the refund (a reason, a request id it
/// made up) gets the replay, not a second refund: the shipped config declares the effect fields, and a
/// keyless call's identity is those fields alone (on b58a043 it was every argument: two refunds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reworded_keyless_retry_is_the_same_refund_under_the_shipped_config() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let session = rig.connect("post_commit_disconnect", 0).await;
    let args = |reason: &str, request: &str| json!({"order_id": ORDER_ID, "amount": 200.0, "reason": reason, "request_id": request});
    let first = session
        .call("refund_order", args("damaged in transit", "req-1"), None)
        .await;
    assert_eq!(
        outcome(&first)["identity_fields"],
        json!(["/order_id", "/amount"]),
        "{}",
        text(&first)
    );
    let retry = session
        .call("refund_order", args("the parcel arrived damaged", "req-7f3a"), None)
        .await;
    let t = text(&retry);
    assert_eq!(outcome(&retry)["decision"], "replayed", "{t}\n{}", rig.logs());
    assert_eq!(outcome(&retry)["operation"], outcome(&first)["operation"], "{t}");
    assert!(t.contains("with the same order_id and amount"), "{t}");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_agent_is_told_unknown_then_gets_the_replay() {
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let session = rig.connect("reject_502", 0).await;
    let first = session.refund(200.0, Some("refund-1234-t")).await;
    assert!(
        text(&first).starts_with("UNKNOWN: refund_order (operation refund-1234-t)"),
        "{}",
        text(&first)
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let result = session.refund(200.0, Some("refund-1234-t")).await;
        if !settling(&result) || Instant::now() > give_up {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Either the background reconciler sent the owed refund first (this call replays it), or this call found
    // the dispatch owed and sent it itself: attempt 2 of the same operation, with the same provider key.
    let t = text(&last);
    match outcome(&last)["decision"].as_str() {
        Some("replayed") => assert!(t.starts_with("Replay of operation refund-1234-t:"), "{t}"),
        Some("executed") => {
            assert_eq!(outcome(&last)["attempt"], 2, "{t}");
            assert_eq!(
                t,
                "Sent now as attempt 2 of operation refund-1234-t; no earlier attempt had an effect."
            );
        }
        other => panic!("the retry ended {other:?}: {t}\n{}", rig.logs()),
    }
    assert_eq!(
        last.structured_content.as_ref().unwrap()["amount"].as_f64(),
        Some(200.0)
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_block_come_from_the_config() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let first = session.refund(200.0, Some("refund-q1")).await;
    assert_eq!(outcome(&first)["decision"], "executed");
    let over = session.refund(150.0, Some("refund-q2")).await;
    let t = text(&over);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: it would pass the spend ceiling for this scope and window"),
        "{t}"
    );
    assert_eq!(over.structured_content.as_ref().unwrap()["once"]["reason"], "quota");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);

    // A tool the config blocks is answered and never forwarded.
    let rig = Rig::new(&format!("{}route = \"block\"\n", fast_config("")));
    let session = rig.connect("none", 0).await;
    let blocked = session.refund(200.0, Some("refund-b")).await;
    let t = text(&blocked);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: the gateway's policy does not allow this tool"),
        "{t}"
    );
    let read = session.call("get_order", json!({"order_id": ORDER_ID}), None).await;
    let order: Value = serde_json::from_str(&text(&read)).unwrap();
    assert_eq!(order["refunded"].as_f64(), Some(0.0), "DIRECT passes through: {order}");
    assert!(session.close().await.success());
    assert_eq!(rig.effects(), (0, 0));
}

/// `approval` in a tool's table: above the threshold a call is not sent but
/// told, in once's words, that a person must approve it; an operator's
/// `once ledger approve` lets exactly that payload go out once; a larger amount
/// under the same key is a conflict; a denied call is refused for good. The
/// effect ledger has the one approved refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_above_the_approval_threshold_waits_for_a_person_and_is_sent_once() {
    let rig = Rig::new(&format!(
        "{}approval = {{ field = \"/amount\", above = \"50\" }}\n",
        fast_config("")
    ));
    let ledger = |args: &[&str]| {
        let out = Command::new(gateway_common::once_exe())
            .args(["ledger", "--db", &rig.db])
            .args(args)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {said}");
        said
    };
    let session = rig.connect("none", 0).await;
    let asked = session.refund(120.0, Some("refund-big")).await;
    let t = text(&asked);
    assert!(
        t.starts_with(
            "AWAITING APPROVAL: refund_order (operation refund-big) is held for a person: nothing more is sent for \
             it until an operator approves this exact call (/amount is 120.0, above 50;"
        ),
        "{t}"
    );
    assert_eq!(outcome(&asked)["decision"], "awaits-approval");
    assert_eq!(outcome(&asked)["effect"], "none");
    // The same call again waits for the same person.
    let again = session.refund(120.0, Some("refund-big")).await;
    assert_eq!(outcome(&again)["decision"], "awaits-approval", "{}", text(&again));
    assert_eq!(rig.effects(), (0, 0));

    let approved = ledger(&["approve", "refund-big", "--note", "ops@example: the customer called"]);
    assert!(approved.contains("refund-big: absent"), "{approved}");
    // A larger amount under the approved key is another payload: refused, never sent on the approval.
    let larger = session.refund(250.0, Some("refund-big")).await;
    assert_eq!(outcome(&larger)["decision"], "conflict", "{}", text(&larger));
    // The approved call: sent by this call or by the gateway's sweep, once either way.
    let sent = session.refund(120.0, Some("refund-big")).await;
    let decision = outcome(&sent)["decision"].clone();
    assert!(decision == "executed" || decision == "replayed", "{}", text(&sent));
    assert_eq!(rig.effects(), (1, 12_000), "{}", rig.logs());

    let small = session.refund(20.0, Some("refund-small")).await;
    assert_eq!(outcome(&small)["decision"], "executed", "{}", text(&small));
    let denied_call = session.refund(60.0, Some("refund-denied")).await;
    assert_eq!(outcome(&denied_call)["decision"], "awaits-approval");
    let denied = ledger(&["deny", "refund-denied", "--note", "ops@example: not this customer"]);
    assert!(denied.contains("refund-denied: denied"), "{denied}");
    let refused = session.refund(60.0, Some("refund-denied")).await;
    let t = text(&refused);
    assert!(
        t.starts_with(
            "BLOCKED: refund_order was not sent: operation refund-denied was not approved (a person denied it"
        ),
        "{t}"
    );
    assert_eq!(outcome(&refused)["reason"], "approval-denied");
    assert!(session.close().await.success());
    assert_eq!(rig.effects(), (2, 14_000), "the approved and the small refund only");
    let shown = ledger(&["show", "refund-big"]);
    assert!(
        shown.contains("approved") && shown.contains("ops@example: the customer called"),
        "{shown}"
    );
}

/// A scope taken from `_meta`: a call without it is refused before anything
/// is recorded or sent, never given some other scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_from_meta_is_required() {
    let rig = Rig::new(&fast_config(r#"scope = "meta:tenant""#));
    let session = rig.connect("none", 0).await;
    let refused = session.refund(200.0, Some("refund-s")).await;
    let t = text(&refused);
    assert_eq!(refused.is_error, Some(true), "{t}");
    assert!(
        t.contains(r#"takes each call's scope from _meta "tenant", and this call has none"#),
        "{t}"
    );
    assert!(t.contains("nothing was sent"), "{t}");
    let mut params =
        CallToolRequestParams::new("refund_order").with_arguments(object(json!({"order_id": ORDER_ID, "amount": 200})));
    params.meta = Some(meta(&[("once/key", "refund-s"), ("tenant", "t-9")]));
    let ran = session.client.call_tool(params).await.unwrap();
    assert_eq!(outcome(&ran)["decision"], "executed", "{}", text(&ran));
    assert_eq!(outcome(&ran)["scope"], "t-9");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

// ---- tools/list, --check-config and bad config ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_passes_through_unchanged() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let through_gateway: Vec<Tool> = session.client.list_all_tools().await.unwrap();
    assert!(session.close().await.success());

    let mut direct = tokio::process::Command::new(refund_mcp());
    direct.arg("--db").arg(rig.dir.path().join("direct.db"));
    let upstream = ().serve(rmcp::transport::TokioChildProcess::new(direct).unwrap()).await.unwrap();
    let from_upstream = upstream.list_all_tools().await.unwrap();
    let _ = upstream.cancel().await;
    assert_eq!(through_gateway, from_upstream);
    let annotations: Vec<_> = through_gateway
        .iter()
        .map(|t| (t.name.to_string(), t.annotations.clone()))
        .collect();
    assert!(annotations.iter().all(|(_, a)| a.is_some()), "{annotations:?}");
}

/// Run a gateway with extra flags until it exits by itself. Its stdin stays open and silent, so one that got
/// as far as serving would wait on it instead of exiting: a bad config must stop it before that.
fn run_gateway_to_exit(rig: &Rig, flags: &[&str]) -> std::process::Output {
    run_to_exit(rig, rig.gateway_command_with(flags, "none"))
}

/// [`run_gateway_to_exit`] for a gateway command made by the test.
fn run_to_exit(rig: &Rig, mut cmd: Command) -> std::process::Output {
    use std::io::Read;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let _stdin = child.stdin.take();
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!("the gateway did not exit by itself\n{}", rig.logs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
    std::process::Output { status, stdout, stderr }
}

/// As shipped (no ONCE_LOG), a gateway's warnings at start reach its stderr; its per-call lines do not.
#[test]
fn start_warnings_are_shown_with_no_log_setting() {
    let rig = Rig::new(&format!("scope = \"session\"\n{}", fast_config("")));
    // No client: the gateway warns as it starts, then exits when nothing initializes on stdin.
    let out = rig
        .gateway_command_with(&[], "none")
        .env_remove("ONCE_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("scope = \"session\": each connection is its own scope"),
        "{stderr}"
    );
    assert!(!stderr.contains(" INFO "), "{stderr}");
}

#[test]
fn check_config_prints_each_tool_route() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let out = run_gateway_to_exit(&rig, &["--check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = |tool: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(tool))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("get_order ").contains(" DIRECT "), "{stdout}");
    assert!(line("find_refund_by_key ").contains(" DIRECT "), "{stdout}");
    let refund = line("refund_order ");
    assert!(refund.contains(" PROTECT "), "{stdout}");
    assert!(refund.contains("provider key -> argument idempotency_key"), "{refund}");
    assert!(refund.contains("reconciles via find_refund_by_key"), "{refund}");
    assert!(refund.contains("quota 500.00"), "{refund}");
}

/// The shipped config names no scope: one stable tenant. `session` is only ever
/// chosen, and `--check-config` says what it means for restarts.
#[test]
fn check_config_states_the_scope_and_warns_about_session_scopes() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let out = run_gateway_to_exit(&rig, &["--check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("scope fixed \"default\""), "{stdout}");
    assert!(stdout.contains("owner \"gateway refund-mcp #"), "{stdout}");
    assert!(!stdout.contains("warning"), "{stdout}");

    // Without declared effect fields, a keyless refund is identified by every argument: said, naming the tool.
    let example = std::fs::read_to_string(EXAMPLE_CONFIG).unwrap();
    let undeclared: String = example
        .lines()
        .filter(|l| !l.starts_with("effect_fields"))
        .map(|l| format!("{l}\n"))
        .collect();
    let rig = Rig::new(&undeclared);
    let out = run_gateway_to_exit(&rig, &["--check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: refund_order: a call without an operation key is identified by all of its arguments"),
        "{stdout}"
    );
    assert!(
        stdout.contains("effect_fields = [\"/field\", …] in [tools.refund_order]"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("warning: get_order"),
        "a DIRECT tool needs no identity: {stdout}"
    );

    let rig = Rig::new(&format!("scope = \"session\"\n{}", fast_config("")));
    let out = run_gateway_to_exit(&rig, &["--check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: scope = \"session\": each connection is its own scope, so after the gateway or its host restarts, a retry with the same operation key is a NEW operation"),
        "{stdout}"
    );
}

#[test]
fn check_config_without_an_upstream_checks_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let path = dir.path().join("once.toml");
        std::fs::write(&path, text).unwrap();
        Command::new(gateway_common::once_exe())
            .args(["gateway", "--check-config", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = check(&fast_config(""));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(": ok (give the upstream command after `--`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("refund_order: route from the upstream's annotations"),
        "{stdout}"
    );
    // The policy goes through the component's own check even without an upstream.
    let out = check("[tools.refund_order]\ntimeout = \"10s\"\nlease = \"5s\"\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("lease_ms 5000 is below dispatch_timeout_ms 10000"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn bad_config_is_a_clear_error_at_start() {
    let lookup = r#"lookup = { tool = "find_refund_by_key", args = { idempotency_key = "{key}" }, found = "/found", read_position = "/read_position" }"#;
    let cases = [
        (
            "[tools.refund_ordr]\nroute = \"protect\"\n".to_string(),
            "[tools.refund_ordr]: the upstream has no tool named \"refund_ordr\" (it has: get_order, refund_order, find_refund_by_key)",
        ),
        (
            format!(
                "[tools.refund_order]\nprovider_key = \"argument:idempotency_key\"\n{}\n",
                lookup.replace("\"/found\"", "\"found\"")
            ),
            "[tools.refund_order]: lookup: found: \"found\" is not a JSON pointer: it must start with \"/\"",
        ),
        (
            "[tools.refund_order]\nreconcile = \"required\"\n".to_string(),
            "[tools.refund_order]: reconcile = \"required\" but no lookup is configured",
        ),
        (
            format!(
                "[tools.refund_order]\nprovider_key = \"argument:idempotency_key\"\n{}\n",
                lookup.replace("find_refund_by_key\"", "find_refund\"")
            ),
            "[tools.refund_order]: lookup.tool \"find_refund\" is not a tool of the upstream",
        ),
        (
            format!("[tools.refund_order]\n{lookup}\n"),
            "the lookup reads by {key}, but the provider key never travels to the upstream",
        ),
        (
            "[tools.refund_order]\ntimeout = \"10s\"\nlease = \"5s\"\n".to_string(),
            "[tools.refund_order]: invalid policy: tool refund_order: lease_ms 5000 is below dispatch_timeout_ms 10000",
        ),
        (
            "[tools.refund_order]\nprovider_claims_key = true\n".to_string(),
            "[tools.refund_order]: invalid policy: tool refund_order: provider_claims_key needs the provider key to reach the provider",
        ),
        (
            "[tools.refund_order]\nderived_window = \"30d\"\n".to_string(),
            "derived_window_ms 2592000000 must be positive and at most retention_ms",
        ),
        (
            "[tools.refund_order]\napproval = \"sometimes\"\n".to_string(),
            "approval \"sometimes\" must be \"never\", \"always\", or a table",
        ),
        (
            "[tools.refund_order]\napproval = { field = \"/amount\", above = 100.5 }\n".to_string(),
            "write a fractional amount as a string",
        ),
        (
            "[tools.refund_order]\neffect_fields = [\"/order_id\"]\napproval = { field = \"/amount\", above = \"100\" }\n"
                .to_string(),
            "[tools.refund_order]: invalid policy: tool refund_order: approval field \"/amount\" must be one of the effect fields",
        ),
        (
            "[defaults]\napproval = \"always\"\n".to_string(),
            "[defaults]: approval belongs to one tool's table",
        ),
    ];
    for (config, expected) in cases {
        let rig = Rig::new(&config);
        let out = run_gateway_to_exit(&rig, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{config}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{config}\nexpected {expected:?} in:\n{stderr}"
        );
        // Nothing was served: the error comes before the client's first byte.
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// An UNKNOWN no read can settle (the tool has no lookup) waits for an operator, not for this gateway: when
/// the client hangs up, the gateway exits instead of waiting out its shutdown grace (an hour here) for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_only_an_operator_can_settle_does_not_hold_the_exit() {
    let rig = Rig::new(
        r#"shutdown_grace = "1h"

[tools.refund_order]
provider_key = "argument:idempotency_key"
timeout = "1s"
max_in_flight = "1500ms"
"#,
    );
    let session = rig.connect("post_commit_disconnect", 0).await;
    let result = session.refund(200.0, Some("no-lookup-1")).await;
    let t = text(&result);
    assert!(t.starts_with("UNKNOWN: refund_order (operation no-lookup-1"), "{t}");
    assert!(
        t.contains("so an operator must (once ledger resolve no-lookup-1)"),
        "{t}"
    );
    // Session::close waits 30 s at most for the exit.
    let status = session.close().await;
    assert!(status.success(), "gateway exit {status}\n{}", rig.logs());
    assert_exactly_one_refund(&rig);
}

// ---- two upstreams, one ledger: records are bound to the upstream they were made for ----

/// Two gateways in front of the same server for two accounts (the account in the environment), on the
/// default ledger and scope: the second is refused at start, saying what to set, instead of answering
/// account B's refund with account A's receipt (b58a043: B was told "Replay", and B's refund never
/// happened). Naming A's scope with an owner of its own does not get B in; a scope and owner of its own
/// do, and B makes its own refund. A restarted from another session (systemd's INVOCATION_ID, another
/// HOSTNAME) is still A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_account_on_the_default_ledger_is_refused_not_answered_with_the_firsts_receipts() {
    let example = std::fs::read_to_string(EXAMPLE_CONFIG).unwrap();
    let a = Rig::with_config_file(EXAMPLE_CONFIG);
    let account = |rig: &Rig, name: &str| {
        let mut command = rig.gateway_command("none");
        command.env("REFUND_ACCOUNT", name);
        command
    };
    let session = a.connect_command(account(&a, "acct-a"), 0).await;
    let first = session.refund(200.0, None).await;
    assert_eq!(outcome(&first)["decision"], "executed", "{}", text(&first));
    assert!(session.close().await.success());
    assert_exactly_one_refund(&a);

    // Account B, the very same command line (even the same effect ledger path): only the environment differs.
    let same_command = a.beside(&example);
    let refused = |out: std::process::Output| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(out.stdout.is_empty(), "nothing was served");
        stderr
    };
    let stderr = refused(run_to_exit(&same_command, account(&same_command, "acct-b")));
    assert!(
        stderr.contains("scope \"default\" on this ledger belongs to another upstream (owner \"gateway refund-mcp #"),
        "{stderr}"
    );
    assert!(
        stderr.contains("a ledger of its own (--db") && stderr.contains("a scope and owner of its own"),
        "{stderr}"
    );

    // B, its own refund service: A's scope named with an owner of B's own is refused too.
    let mut b = Rig::with_config_file(EXAMPLE_CONFIG);
    b.db = a.db.clone();
    std::fs::write(
        &b.config,
        format!("scope = \"fixed:default\"\nowner = \"acct-b\"\n{example}"),
    )
    .unwrap();
    let stderr = refused(run_to_exit(&b, account(&b, "acct-b")));
    assert!(stderr.contains("this gateway is \"acct-b\""), "{stderr}");
    assert_eq!(b.effects(), (0, 0));

    // A scope and owner of its own: B is its own upstream on the shared ledger, and its refund happens.
    std::fs::write(
        &b.config,
        format!("scope = \"fixed:acct-b\"\nowner = \"acct-b\"\n{example}"),
    )
    .unwrap();
    let session = b.connect_command(account(&b, "acct-b"), 1).await;
    let own = session.refund(200.0, None).await;
    assert_eq!(outcome(&own)["decision"], "executed", "{}\n{}", text(&own), b.logs());
    assert_eq!(outcome(&own)["scope"], "acct-b");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&b);
    assert_exactly_one_refund(&a);

    // A restarted by a service manager on another machine name is still A: the same call answers from its record.
    let mut command = account(&a, "acct-a");
    command.env("INVOCATION_ID", "5e0c7a1b").env("HOSTNAME", "other-host");
    let session = a.connect_command(command, 2).await;
    let again = session.refund(200.0, None).await;
    assert_eq!(
        outcome(&again)["decision"],
        "replayed",
        "{}\n{}",
        text(&again),
        a.logs()
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&a);
}

/// A credential on the upstream's command line never reaches the ledger (its owner column or any row),
/// an answer, a log line or `--check-config`'s report (b58a043 stored the whole command line as every
/// record's owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_on_the_command_line_is_never_stored_shown_or_logged() {
    const SECRET: &str = "sk-live-4f9a7c1e2b";
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let wrapper = ["env".to_string(), format!("API_KEY={SECRET}")];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let command = |flags: &[&str]| {
        let mut cmd = rig.gateway_command_wrapped(flags, &wrapper, "none");
        cmd.env("ONCE_LOG", "once=debug");
        cmd
    };
    let checked = run_to_exit(&rig, command(&["--check-config"]));
    let report = String::from_utf8_lossy(&checked.stdout).into_owned() + &String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{report}");
    assert!(report.contains("owner \"gateway env #"), "{report}");

    let session = rig.connect_command(command(&[]), 0).await;
    let mut answers = Vec::new();
    answers.push(session.refund(200.0, None).await);
    answers.push(session.refund(200.0, None).await);
    answers.push(session.call("get_order", json!({"order_id": ORDER_ID}), None).await);
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);

    assert!(!report.contains(SECRET), "--check-config: {report}");
    for answer in &answers {
        let said = serde_json::to_string(answer).unwrap();
        assert!(!said.contains(SECRET), "{said}");
    }
    let logs = rig.logs();
    assert!(logs.contains("once::gateway"), "the log was written: {logs}");
    assert!(!logs.contains(SECRET), "{logs}");
    for file in ["once.db", "once.db-wal"] {
        let path = std::path::Path::new(&rig.db).with_file_name(file);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            // The WAL is folded into the file when the last connection closes.
            Err(e) if file.ends_with("-wal") && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        let found = bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes());
        assert!(!found, "{} holds the credential", path.display());
    }
    let owners: Vec<String> = once::Once::open(&rig.db)
        .unwrap()
        .build()
        .unwrap()
        .list(None, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.owner.unwrap_or_default())
        .collect();
    assert!(
        !owners.is_empty() && owners.iter().all(|o| o.starts_with("gateway env #")),
        "{owners:?}"
    );
}

/// A gateway whose upstream command changed (a new flag) is a new owner: refused on the ledger its old
/// name served, with that name in the message, and the old name's unknown record left to nobody (b58a043:
/// started, told callers "once is checking … in the background", and never read or sent it). `once ledger
/// adopt` (audited) hands the records and the scope to the new name; the renamed gateway then settles the
/// refund exactly once and the retry gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_gateways_records_are_adopted_and_settled_once() {
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let first = rig.connect("pre_effect_disconnect", 0).await;
    let lost = first.refund(200.0, Some("refund-1234-renamed")).await;
    assert_eq!(outcome(&lost)["decision"], "unknown", "{}\n{}", text(&lost), rig.logs());
    first.kill().await;
    let old_owner = {
        let db = rig.db.clone();
        tokio::task::spawn_blocking(move || {
            let once = once::Once::open(&db).unwrap().build().unwrap();
            once.inspect("default", "refund-1234-renamed").unwrap().unwrap().owner
        })
        .await
        .unwrap()
    };
    assert!(old_owner.starts_with("gateway refund-mcp #"), "{old_owner}");

    // The same server with one more flag: another identity, another owner.
    let renamed = |flags: &[&str]| {
        let mut cmd = rig.gateway_command_with(flags, "none");
        cmd.args(["--late-reply-ms", "2999"]);
        cmd
    };
    let out = run_to_exit(&rig, renamed(&[]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("owner {old_owner:?}")), "{stderr}");
    // The same provider account (a flag changed, no credential): the refusal says how to say so. Without it
    // the renamed gateway neither sends the old account's operations nor takes its own reads as their absence.
    let account = named_account(&stderr).unwrap_or_else(|| panic!("the refusal names the account to set: {stderr}"));
    assert_eq!(account, format!("upstream #{}", &old_owner[old_owner.len() - 12..]));
    std::fs::write(
        &rig.config,
        format!("account = \"{account}\"\n{}", fast_config("in_flight_wait = \"0ms\"")),
    )
    .unwrap();
    let checked = run_to_exit(&rig, renamed(&["--check-config"]));
    let report = String::from_utf8_lossy(&checked.stdout).into_owned();
    let new_owner = report
        .split("owner \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no owner in {report}"))
        .to_string();
    assert_ne!(new_owner, old_owner);
    assert!(report.contains(&format!("account {account:?}")), "{report}");

    let adopt = Command::new(gateway_common::once_exe())
        .args([
            "ledger", "--db", &rig.db, "adopt", "--from", &old_owner, "--to", &new_owner,
        ])
        .args(["--note", "the refund server got a new flag"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&adopt.stdout);
    assert!(
        adopt.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&adopt.stderr)
    );
    assert!(said.contains("adopted 1 records of"), "{said}");
    assert!(
        said.contains(&format!("scope:default now belongs to {new_owner:?}")),
        "{said}"
    );

    let session = rig.connect_command(renamed(&[]), 1).await;
    let give_up = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let result = session.refund(200.0, Some("refund-1234-renamed")).await;
        if !settling(&result) || Instant::now() > give_up {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let t = text(&last);
    assert!(
        matches!(outcome(&last)["decision"].as_str(), Some("replayed" | "executed")),
        "{t}\n{}",
        rig.logs()
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
    let audit = rig.audit(&last);
    assert!(
        audit
            .iter()
            .any(|e| e.starts_with("adopted: ") && e.contains("the refund server got a new flag")),
        "{audit:#?}"
    );
}
