//! Just enough HTTP/1.1 to move one whole request and one whole response per connection.
//!
//! Both the service and the proxy speak `Connection: close`, so a message is a head plus a `Content-Length` body
//! (a response without one runs to EOF). Chunked bodies are refused rather than half-supported.

use std::io::{self, Read, Write};

/// Largest head accepted; our clients send a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;
/// Largest body accepted; a refund request is under a hundred bytes.
const MAX_BODY: usize = 1024 * 1024;

/// One parsed message: the start line split at spaces, headers in order, the whole body.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub start: [String; 3],
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    /// First value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Which side of the exchange a message is, since only a response may be delimited by EOF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Request,
    Response,
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Reads one whole message; `Ok(None)` when the peer closed before sending a byte (a probe or a wake-up).
pub(crate) fn read_message(stream: &mut impl Read, kind: Kind) -> io::Result<Option<Message>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = find_head_end(&buf) {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("head too large"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| invalid("head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let start_line = lines.next().unwrap_or_default();
    let mut parts = start_line.splitn(3, ' ');
    let start = [
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    ];
    if start.iter().take(2).any(String::is_empty) {
        return Err(invalid("bad start line"));
    }
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or_else(|| invalid("bad header"))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut msg = Message {
        start,
        headers,
        body: buf.split_off(head_end + 4),
    };
    if msg.header("transfer-encoding").is_some() {
        return Err(invalid("chunked bodies are not supported"));
    }
    match msg.header("content-length") {
        Some(len) => {
            let len: usize = len.parse().map_err(|_| invalid("bad content-length"))?;
            if len > MAX_BODY {
                return Err(invalid("body too large"));
            }
            while msg.body.len() < len {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                msg.body.extend_from_slice(&chunk[..n]);
            }
            // Bytes past the body would be a pipelined request; one exchange per connection drops them.
            msg.body.truncate(len);
        }
        None if kind == Kind::Response => {
            stream.take(MAX_BODY as u64).read_to_end(&mut msg.body)?;
        }
        None => msg.body.clear(),
    }
    Ok(Some(msg))
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Writes a message with our framing: hop-by-hop and length headers replaced, `Connection: close` added.
pub(crate) fn write_message(stream: &mut impl Write, msg: &Message) -> io::Result<()> {
    let mut out = Vec::with_capacity(256 + msg.body.len());
    out.extend_from_slice(format!("{} {} {}\r\n", msg.start[0], msg.start[1], msg.start[2]).as_bytes());
    for (name, value) in &msg.headers {
        let hop = [
            "connection",
            "keep-alive",
            "content-length",
            "transfer-encoding",
            "proxy-connection",
        ];
        if !hop.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
    }
    out.extend_from_slice(format!("Content-Length: {}\r\nConnection: close\r\n\r\n", msg.body.len()).as_bytes());
    out.extend_from_slice(&msg.body);
    // One write so a request or reply leaves as a unit; a half-written message would be a fault we did not inject.
    stream.write_all(&out)?;
    stream.flush()
}

/// A JSON response with the given status.
pub(crate) fn json_response(status: u16, body: String) -> Message {
    Message {
        start: ["HTTP/1.1".to_string(), status.to_string(), reason(status).to_string()],
        headers: vec![("Content-Type".to_string(), "application/json".to_string())],
        body: body.into_bytes(),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        _ => "Unknown",
    }
}

/// Splits a request target into its path and decoded query pairs.
pub(crate) fn split_target(target: &str) -> (&str, Vec<(String, String)>) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let pairs = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    (path, pairs)
}

/// Decodes `%XX` and `+`; a malformed escape is kept literally rather than guessed at.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() && bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit() => {
                out.push(hex(bytes[i + 1]) << 4 | hex(bytes[i + 2]));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// Encodes everything but RFC 3986 unreserved characters, so any key survives a query string.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_round_trip() {
        for s in ["plain", "a b+c", "k/ey?&=%", "émoji🙂", "%", "%4", "%zz"] {
            assert_eq!(percent_decode(&percent_encode(s)), s);
        }
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%41%zz"), "A%zz");
    }

    #[test]
    fn reads_request_with_body() {
        let raw = b"POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let msg = read_message(&mut &raw[..], Kind::Request).unwrap().unwrap();
        assert_eq!(msg.start, ["POST", "/refunds", "HTTP/1.1"]);
        assert_eq!(msg.header("HOST"), Some("x"));
        assert_eq!(msg.body, b"hello");
    }

    #[test]
    fn response_without_length_runs_to_eof() {
        let raw = b"HTTP/1.1 200 OK\r\n\r\n{}";
        let msg = read_message(&mut &raw[..], Kind::Response).unwrap().unwrap();
        assert_eq!(msg.start[1], "200");
        assert_eq!(msg.body, b"{}");
    }

    #[test]
    fn truncated_body_is_an_error() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nhi";
        assert!(read_message(&mut &raw[..], Kind::Request).is_err());
        assert!(read_message(&mut &b""[..], Kind::Request).unwrap().is_none());
    }
}
