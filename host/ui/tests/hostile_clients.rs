//! The operator's page against clients that hold its connections: one that
//! sends half a request, one that sends its body slowly or too much of it,
//! and a flood of idle connections, which must never close an operator's.
//! Served as `once ui` serves it (`once_ui::serve`), with short limits so the
//! test need not wait the defaults out (`once ui`'s own test does, once).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use once::Once;
use once_ui::{Access, Operator, Ui, token_sha256};

const TOKEN: &str = "a-test-operator-token";
/// The limits the server runs with here.
const HEADER_TIMEOUT: Duration = Duration::from_millis(400);
const BODY_TIMEOUT: Duration = Duration::from_millis(400);
/// How long a test waits for what should come long before it (a closed socket, an answer).
const PATIENCE: Duration = Duration::from_secs(20);

struct Served {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

fn serve(max_unauthenticated: usize) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(Once::sqlite(dir.path().join("ledger.db")).unwrap().build().unwrap());
    let operator = Operator {
        name: "operator".into(),
        token_sha256: token_sha256(TOKEN),
        scopes: None,
    };
    let ui = Ui::new(once, Access::new(vec![operator]).unwrap())
        .header_timeout(HEADER_TIMEOUT)
        .body_timeout(BODY_TIMEOUT)
        .max_unauthenticated(max_unauthenticated);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(once_ui::serve(listener, ui));
    Served {
        addr,
        _dir: dir,
        _runtime: runtime,
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// Everything the server sends until it closes the connection; panics if it keeps it open past `PATIENCE`.
fn until_closed(stream: &mut TcpStream) -> String {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&got).into_owned();
            }
            Err(e) => panic!(
                "the server kept the connection open {:?} (it sent {:?}): {e}",
                started.elapsed(),
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

/// One keep-alive request on `stream` with the operator's token: the status line of its answer.
fn operator_get(stream: &mut TcpStream, path: &str) -> String {
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: ui\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    // Read until the whole answer is in: its headers and `Content-Length` bytes after them.
    loop {
        let n = stream.read(&mut buf).expect("the operator's connection was closed");
        assert!(n > 0, "the operator's connection was closed");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text.lines().next().unwrap_or_default().to_string();
            }
        }
    }
}

#[test]
fn half_a_request_is_cut_off_at_the_header_timeout() {
    let served = serve(64);
    let mut stream = connect(served.addr);
    stream.write_all(b"GET / HTTP/1.1\r\nHost: ui\r\n").unwrap();
    let answer = until_closed(&mut stream);
    assert!(!answer.contains("200 OK"), "{answer:?}");
    // An idle connection (no byte at all) is closed too.
    let mut idle = connect(served.addr);
    until_closed(&mut idle);
}

#[test]
fn a_slow_body_is_answered_408_and_too_large_a_body_413() {
    let served = serve(64);
    let mut slow = connect(served.addr);
    write!(
        slow,
        "POST /login HTTP/1.1\r\nHost: ui\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken="
    )
    .unwrap();
    let answer = until_closed(&mut slow);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("did not arrive within"), "{answer:?}");
    // The security headers are on this answer too.
    assert!(
        answer.to_ascii_lowercase().contains("x-frame-options: deny"),
        "{answer:?}"
    );

    let mut large = connect(served.addr);
    let body = "n".repeat(once_ui::BODY_LIMIT + 1);
    write!(
        large,
        "POST /login HTTP/1.1\r\nHost: ui\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let answer = until_closed(&mut large);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
}

#[test]
fn a_flood_of_idle_connections_never_closes_an_operators() {
    let served = serve(4);
    let mut operator = connect(served.addr);
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
    // Twice the cap of connections that never send a byte: the oldest of them are closed to make room, the
    // operator's (out of the cap since its first request) is not.
    let mut flood: Vec<TcpStream> = (0..8).map(|_| connect(served.addr)).collect();
    let first = until_closed(&mut flood[0]);
    assert_eq!(first, "", "an idle connection is closed without an answer");
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
    // A request without credentials does not take its connection out of the cap.
    let mut stranger = connect(served.addr);
    write!(stranger, "GET / HTTP/1.1\r\nHost: ui\r\n\r\n").unwrap();
    let _more: Vec<TcpStream> = (0..8).map(|_| connect(served.addr)).collect();
    let answered = until_closed(&mut stranger);
    assert!(answered.starts_with("HTTP/1.1 401"), "{answered:?}");
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
}
