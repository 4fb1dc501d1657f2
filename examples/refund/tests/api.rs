//! The HTTP API's shapes, rejections and snapshot reads, spoken to with raw sockets as well as the client.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::{TIMEOUT, Trial};
use refund::{CallError, Client, EffectLedger, Fault, Mode, ORDER_ID, Service};

/// One raw exchange: (status, body).
fn raw(addr: SocketAddr, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains("Connection: close") && head.contains("Content-Type: application/json"),
        "{head}"
    );
    (head[9..12].parse().unwrap(), body.to_string())
}

fn post(addr: SocketAddr, body: &str) -> (u16, String) {
    raw(addr, "POST", "/refunds", body)
}

#[test]
fn shapes() {
    let t = Trial::new(Mode::Idempotent, Fault::None);
    let addr = t.service.addr();
    assert_eq!(raw(addr, "GET", "/healthz", ""), (200, r#"{"ok":true}"#.to_string()));
    let (status, body) = raw(addr, "GET", "/orders/1234", "");
    assert_eq!(status, 200);
    assert!(
        body.starts_with(r#"{"order_id":1234,"total":500.0,"refunded":0.0,"read_position":"#),
        "{body}"
    );
    assert_eq!(
        raw(addr, "GET", "/orders/9", ""),
        (404, r#"{"error":"no such order"}"#.to_string())
    );
    assert_eq!(raw(addr, "GET", "/orders/x", "").0, 404);
    assert_eq!(raw(addr, "GET", "/nope", "").0, 404);
    assert_eq!(raw(addr, "DELETE", "/refunds", "").0, 405);

    let (status, body) = post(addr, r#"{"order_id":1234,"amount":200,"idempotency_key":"K"}"#);
    assert_eq!(status, 200);
    let refund = &t.refunds()[0];
    let receipt = format!(
        r#"{{"refund_id":1,"order_id":1234,"amount":200.0,"idempotency_key":"K","created_at":{}}}"#,
        refund.created_at_ms
    );
    assert_eq!(body, receipt);
    // Replays answer byte-for-byte the same body.
    assert_eq!(
        post(addr, r#"{"amount":200.00,"idempotency_key":"K","order_id":1234}"#),
        (200, receipt.clone())
    );
    let (status, body) = raw(addr, "GET", "/refunds?key=K", "");
    assert_eq!(status, 200);
    assert!(
        body.starts_with(&format!(r#"{{"found":true,"refund":{receipt},"read_position":"#)),
        "{body}"
    );
    let (_, body) = raw(addr, "GET", "/refunds?key=other", "");
    assert!(body.starts_with(r#"{"found":false,"read_position":"#), "{body}");
    assert_eq!(raw(addr, "GET", "/refunds", "").0, 400);
}

#[test]
fn rejections_write_nothing() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::None);
        let addr = t.service.addr();
        let cases = [
            (r#"{"order_id":99,"amount":200,"idempotency_key":"K"}"#, 404),
            (r#"{"order_id":1234,"amount":500.01,"idempotency_key":"K"}"#, 422),
            (r#"{"order_id":1234,"amount":1e30,"idempotency_key":"K"}"#, 422),
            (r#"{"order_id":1234,"amount":0,"idempotency_key":"K"}"#, 422),
            (r#"{"order_id":1234,"amount":-5,"idempotency_key":"K"}"#, 422),
            (r#"{"order_id":1234,"amount":200}"#, 400),
            (r#"{"order_id":1234,"amount":200,"idempotency_key":""}"#, 400),
            (r#"{"order_id":1234,"amount":0.001,"idempotency_key":"K"}"#, 400),
            (r#"{"order_id":1234,"amount":"lots","idempotency_key":"K"}"#, 400),
            (r#"{"order_id":1234,"amount":true,"idempotency_key":"K"}"#, 400),
            (r#"{"order_id":"1234","amount":200,"idempotency_key":"K"}"#, 400),
            (r#"{"order_id":1234,"idempotency_key":"K"}"#, 400),
            (
                r#"{"order_id":1234,"amount":200,"idempotency_key":"K","order_id":1}"#,
                400,
            ),
            (r#"not json"#, 400),
            ("", 400),
        ];
        for (body, want) in cases {
            let (status, reply) = post(addr, body);
            assert_eq!(status, want, "{mode} {body} -> {reply}");
            assert!(reply.starts_with(r#"{"error":"#), "{reply}");
        }
        assert_eq!(t.count(), 0, "{mode}");
        assert_eq!(t.ledger().refunded_cents(ORDER_ID).unwrap(), 0);
        // The client reports a 4xx as a definite rejection, with the body.
        match t.client(TIMEOUT).refund_order(ORDER_ID, 600.0, "K") {
            Err(CallError::Rejected { status: 422, body }) => assert!(body.contains("exceed")),
            other => panic!("{other:?}"),
        }
        match t.client(TIMEOUT).get_order(7) {
            Err(CallError::Rejected { status: 404, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(t.count(), 0);
    }
}

#[test]
fn idempotent_mode_refuses_a_key_reused_for_another_refund() {
    let t = Trial::new(Mode::Idempotent, Fault::None);
    let client = t.direct();
    client.refund_order(ORDER_ID, 200.0, "K").unwrap();
    match client.refund_order(ORDER_ID, 150.0, "K") {
        Err(CallError::Rejected { status: 409, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(t.count(), 1);
}

#[test]
fn amounts_are_exact_cents() {
    let t = Trial::new(Mode::Unsafe, Fault::None);
    let client = t.direct();
    for (amount, key) in [(0.29, "a"), (19.99, "b"), (0.1, "c"), (100.0, "d")] {
        let receipt = client.refund_order(ORDER_ID, amount, key).unwrap();
        assert_eq!(receipt.amount, amount);
    }
    assert_eq!(
        post(
            t.service.addr(),
            r#"{"order_id":1234,"amount":"1.5e1","idempotency_key":"e"}"#
        )
        .0,
        200
    );
    let cents: Vec<i64> = t.refunds().iter().map(|r| r.amount_cents).collect();
    assert_eq!(cents, [29, 1999, 10, 10_000, 1_500]);
    assert_eq!(t.ledger().refunded_cents(ORDER_ID).unwrap(), 13_538);
    assert_eq!(client.get_order(ORDER_ID).unwrap().refunded, 135.38);
    // Exactly the remainder is allowed; a cent more is not.
    client.refund_order(ORDER_ID, 364.62, "f").unwrap();
    assert!(matches!(
        client.refund_order(ORDER_ID, 0.01, "g"),
        Err(CallError::Rejected { status: 422, .. })
    ));
    assert!(matches!(
        client.refund_order(ORDER_ID, f64::NAN, "h"),
        Err(CallError::NotSent(_))
    ));
}

#[test]
fn as_of_reads_an_honest_older_snapshot() {
    let t = Trial::new(Mode::Unsafe, Fault::None);
    let client = t.direct();
    let first = client.refund_order(ORDER_ID, 100.0, "a").unwrap();
    std::thread::sleep(Duration::from_millis(3));
    let second = client.refund_order(ORDER_ID, 50.0, "b").unwrap();
    assert!(first.created_at < second.created_at);
    let addr = t.service.addr();
    let at = |target: String| raw(addr, "GET", &target, "").1;
    assert!(at(format!("/orders/1234?as_of={}", first.created_at)).contains(r#""refunded":100.0"#));
    assert!(at(format!("/orders/1234?as_of={}", first.created_at - 1)).contains(r#""refunded":0.0"#));
    assert!(at("/orders/1234".to_string()).contains(r#""refunded":150.0"#));
    let before = at(format!("/refunds?key=b&as_of={}", second.created_at - 1));
    assert_eq!(
        before,
        format!(r#"{{"found":false,"read_position":{}}}"#, second.created_at - 1)
    );
    assert!(at(format!("/refunds?key=b&as_of={}", second.created_at)).contains(r#""found":true"#));
    // A snapshot from the future would be a promise about commits that have not happened: clamped to now.
    let (_, future) = raw(addr, "GET", "/refunds?key=zz&as_of=99999999999999", "");
    let v: serde_json::Value = serde_json::from_str(&future).unwrap();
    assert!(v["read_position"].as_u64().unwrap() <= refund::now_ms());
    assert_eq!(raw(addr, "GET", "/refunds?key=b&as_of=soon", "").0, 400);
}

#[test]
fn keys_survive_the_query_string() {
    let t = Trial::new(Mode::Idempotent, Fault::None);
    let client = t.client(TIMEOUT);
    let key = "scope/ä b&c=d?e%f+g#h";
    client.refund_order(ORDER_ID, 1.0, key).unwrap();
    let lookup = client.find_refund_by_key(key).unwrap();
    assert!(lookup.found);
    assert_eq!(lookup.refund.unwrap().idempotency_key, key);
    assert_eq!(t.refunds()[0].op_key, key);
}

#[test]
fn read_position_covers_earlier_commits() {
    let t = Trial::new(Mode::Unsafe, Fault::None);
    let client = t.direct();
    for i in 0..20 {
        let key = format!("k{i}");
        let receipt = client.refund_order(ORDER_ID, 1.0, &key).unwrap();
        let lookup = client.find_refund_by_key(&key).unwrap();
        assert!(
            lookup.found && lookup.read_position >= receipt.created_at,
            "{lookup:?} {receipt:?}"
        );
    }
}

#[test]
fn refused_connection_is_not_sent() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = Client::new(format!("http://127.0.0.1:{port}/"), TIMEOUT);
    assert!(matches!(
        client.refund_order(ORDER_ID, 1.0, "k"),
        Err(CallError::NotSent(_))
    ));
    assert!(matches!(client.find_refund_by_key("k"), Err(CallError::NotSent(_))));
}

#[test]
fn proxy_answers_502_when_the_service_is_gone() {
    let t = Trial::new(Mode::Idempotent, Fault::None);
    let Trial { proxy, service, dir } = t;
    drop(service);
    let client = Client::new(proxy.base_url(), TIMEOUT);
    assert!(matches!(client.get_order(ORDER_ID), Err(CallError::Ambiguous(_))));
    drop((proxy, dir));
}

#[test]
fn ledger_survives_restart_and_missing_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    assert!(EffectLedger::open(&path).is_err());
    let created_at = {
        let service = Service::start(&path, Mode::Idempotent).unwrap();
        Client::new(service.base_url(), TIMEOUT)
            .refund_order(ORDER_ID, 200.0, "K")
            .unwrap()
            .created_at
    };
    let service = Service::start(&path, Mode::Idempotent).unwrap();
    let client = Client::new(service.base_url(), TIMEOUT);
    let replay = client.refund_order(ORDER_ID, 200.0, "K").unwrap();
    assert_eq!((replay.refund_id, replay.created_at), (1, created_at));
    assert_eq!(client.get_order(ORDER_ID).unwrap().refunded, 200.0);
    let ledger = EffectLedger::open(&path).unwrap();
    assert_eq!(ledger.count(ORDER_ID).unwrap(), 1);
    assert_eq!(ledger.refunds(ORDER_ID).unwrap()[0].op_key, "K");
    assert_eq!(ledger.count(99).unwrap(), 0);
}

#[test]
fn names_round_trip() {
    for fault in Fault::ALL {
        assert_eq!(fault.name().parse::<Fault>().unwrap(), fault);
    }
    for mode in Mode::ALL {
        assert_eq!(mode.name().parse::<Mode>().unwrap(), mode);
    }
    let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
    assert_eq!(
        names,
        [
            "none",
            "pre_effect_disconnect",
            "post_commit_disconnect",
            "reject_502",
            "late_reply",
            "crash_after_dispatch",
            "concurrent_duplicate",
            "stale_read"
        ]
    );
    assert!("bogus".parse::<Fault>().is_err());
    assert!("bogus".parse::<Mode>().is_err());
}

#[test]
fn a_fresh_lookup_sees_exactly_the_refunds_stamped_by_its_position() {
    let t = Trial::new(Mode::Unsafe, Fault::None);
    let client = t.direct();
    let writes = 60;
    let observed = std::thread::scope(|s| {
        for w in 0..2 {
            let client = client.clone();
            s.spawn(move || {
                for i in 0..writes {
                    client.refund_order(ORDER_ID, 0.01, &format!("w{w}-{i}")).unwrap();
                }
            });
        }
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let client = client.clone();
                s.spawn(move || {
                    (0..2 * writes)
                        .map(|i| {
                            // One ahead of the writers, so both answers come up.
                            let key = format!("w{}-{}", i % 2, i / 2 + 1);
                            let lookup = client.find_refund_by_key(&key).unwrap();
                            (key, lookup.found, lookup.read_position)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        readers.into_iter().flat_map(|r| r.join().unwrap()).collect::<Vec<_>>()
    });
    let stamps: std::collections::HashMap<String, u64> =
        t.refunds().into_iter().map(|r| (r.op_key, r.created_at_ms)).collect();
    assert_eq!(stamps.len(), 2 * writes);
    let found = observed.iter().filter(|o| o.1).count();
    for (key, found, position) in &observed {
        let stamp = stamps.get(key);
        assert_eq!(
            *found,
            stamp.is_some_and(|s| s <= position),
            "{key}: found={found} at {position}, stamp {stamp:?}"
        );
    }
    eprintln!("{} lookups, {found} found", observed.len());
}
