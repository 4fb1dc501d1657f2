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
/// The limits the server runs with here: short, where a test waits them out.
const HEADER_TIMEOUT: Duration = Duration::from_millis(400);
const BODY_TIMEOUT: Duration = Duration::from_millis(400);
/// The header timeout where a test must not meet it (a close then comes from something else).
const LONG: Duration = Duration::from_secs(60);
/// How long a test waits for what should come long before it (a closed socket, an answer); below `LONG`.
const PATIENCE: Duration = Duration::from_secs(20);

struct Served {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

fn serve(max_unauthenticated: usize, header_timeout: Duration) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(Once::sqlite(dir.path().join("ledger.db")).unwrap().build().unwrap());
    let operator = Operator {
        name: "operator".into(),
        token_sha256: token_sha256(TOKEN),
        scopes: None,
    };
    let ui = Ui::new(once, Access::new(vec![operator]).unwrap())
        .header_timeout(header_timeout)
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

/// One keep-alive request on `stream`: the status line and headers of its answer, read whole.
fn exchange(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    // Read until the whole answer is in: its headers and `Content-Length` bytes after them.
    loop {
        let n = stream.read(&mut buf).expect("the connection was closed");
        assert!(n > 0, "the connection was closed");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_string();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return head;
            }
        }
    }
}

/// A sign-in form's POST that declares `length` bytes of body and sends `sent` of them.
fn login_form(length: usize, sent: &str) -> String {
    format!(
        "POST /login HTTP/1.1\r\nHost: ui\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {length}\r\n\r\n{sent}"
    )
}

/// The status line of the answer to a keep-alive GET of `path` with the operator's token.
fn operator_get(stream: &mut TcpStream, path: &str) -> String {
    let head = exchange(
        stream,
        &format!("GET {path} HTTP/1.1\r\nHost: ui\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"),
    );
    head.lines().next().unwrap_or_default().to_string()
}

/// Connections that never send a byte, enough to push every unauthenticated one out of a cap of `cap`.
fn flood(addr: SocketAddr, cap: usize) -> Vec<TcpStream> {
    (0..2 * cap).map(|_| connect(addr)).collect()
}

#[test]
fn half_a_request_is_cut_off_at_the_header_timeout() {
    let served = serve(64, HEADER_TIMEOUT);
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
    let served = serve(64, HEADER_TIMEOUT);
    let mut slow = connect(served.addr);
    slow.write_all(login_form(100, "token=").as_bytes()).unwrap();
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
    large.write_all(login_form(body.len(), &body).as_bytes()).unwrap();
    let answer = until_closed(&mut large);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    // A declared length past the limit is refused before any of it is read or asked for: 413, not the 408
    // its missing body would earn, and no `100 Continue`.
    let mut declared = connect(served.addr);
    write!(
        declared,
        "POST /login HTTP/1.1\r\nHost: ui\r\nExpect: 100-continue\r\nContent-Length: 10000000\r\n\r\n"
    )
    .unwrap();
    let answer = until_closed(&mut declared);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
}

#[test]
fn a_flood_of_idle_connections_never_closes_an_operators() {
    // The header timeout is long: every close below is the cap's.
    let served = serve(4, LONG);
    let mut operator = connect(served.addr);
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
    let mut idle = flood(served.addr, 4);
    assert_eq!(
        until_closed(&mut idle[0]),
        "",
        "the oldest idle connection is closed to make room"
    );
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
    // A request without credentials, answered, does not take its connection out of the cap.
    let mut stranger = connect(served.addr);
    let refused = exchange(&mut stranger, "GET / HTTP/1.1\r\nHost: ui\r\n\r\n");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused:?}");
    let _more = flood(served.addr, 4);
    until_closed(&mut stranger);
    assert_eq!(operator_get(&mut operator, "/"), "HTTP/1.1 200 OK");
}

#[test]
fn a_browsers_sign_in_takes_its_connection_out_of_the_cap() {
    let served = serve(4, LONG);
    let mut browser = connect(served.addr);
    // The token in the form's body, as the sign-in page sends it; the session cookie comes back.
    let form = format!("token={TOKEN}");
    let head = exchange(&mut browser, &login_form(form.len(), &form));
    assert!(head.starts_with("HTTP/1.1 303"), "{head:?}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_string();
    let mut idle = flood(served.addr, 4);
    assert_eq!(until_closed(&mut idle[0]), "");
    let page = exchange(
        &mut browser,
        &format!("GET / HTTP/1.1\r\nHost: ui\r\nCookie: {cookie}\r\n\r\n"),
    );
    assert!(page.starts_with("HTTP/1.1 200"), "{page:?}");
}
