//! `once gateway --listen` as a process, and a plain JSON-RPC-over-HTTP client of it
//! (Streamable HTTP, stateless: one POST per request, the answer as JSON or SSE).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use ureq::Agent;

use super::Rig;

/// A gateway listening on HTTP; killed (if still running) when dropped.
pub struct Listening {
    pub child: Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

/// What one HTTP request got.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub www_authenticate: Option<String>,
    /// The JSON-RPC response (the last SSE event carrying an id, or the JSON body).
    pub message: Option<Value>,
    pub body: String,
}

impl Answer {
    /// The tools/call result (panics on a JSON-RPC error or no message).
    pub fn result(&self) -> &Value {
        let message = self
            .message
            .as_ref()
            .unwrap_or_else(|| panic!("no JSON-RPC answer: {self:?}"));
        message
            .get("result")
            .unwrap_or_else(|| panic!("not a result: {message}"))
    }

    /// The first text block a model reads.
    pub fn text(&self) -> String {
        self.result()["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// once's account of the call (`_meta["once/outcome"]`).
    pub fn outcome(&self) -> &Value {
        &self.result()["_meta"]["once/outcome"]
    }
}

impl Rig {
    /// `once gateway --listen 127.0.0.1:0` over a refund-mcp with `fault`; log `n` in the rig's dir.
    pub fn listen(&self, fault: &str, n: usize) -> Listening {
        self.listen_with(&[], fault, n)
    }

    pub fn listen_with(&self, flags: &[&str], fault: &str, n: usize) -> Listening {
        self.listen_full(flags, &[], fault, n)
    }

    /// With more arguments for refund-mcp (`--late-reply-ms 1500`).
    pub fn listen_upstream(&self, upstream: &[&str], fault: &str, n: usize) -> Listening {
        self.listen_full(&[], upstream, fault, n)
    }

    fn listen_full(&self, flags: &[&str], upstream: &[&str], fault: &str, n: usize) -> Listening {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(flags);
        let mut cmd = self.gateway_command_with(&all, fault);
        cmd.args(upstream);
        self.spawn_listening(cmd, n)
    }

    /// As [`Rig::listen`], with the gateway's file-descriptor limit (`ulimit -n`) set to `nofile`.
    pub fn listen_with_nofile(&self, nofile: u32, fault: &str, n: usize) -> Listening {
        let inner = self.gateway_command_with(&["--listen", "127.0.0.1:0"], fault);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$@\""))
            .arg("sh")
            .arg(inner.get_program())
            .args(inner.get_args());
        for (key, value) in inner.get_envs() {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        self.spawn_listening(cmd, n)
    }

    /// Start `cmd` (a `once gateway --listen 127.0.0.1:0 …`) with its log as gateway `n`'s: the address it names first.
    pub fn spawn_listening(&self, mut cmd: Command, n: usize) -> Listening {
        let log = std::fs::File::create(self.log(n)).unwrap();
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("once gateway: listening on ")
            .unwrap_or_else(|| panic!("the gateway names its address first, not {line:?}\n{}", self.logs()))
            .to_string();
        let base = url.trim_end_matches("/mcp").to_string();
        Listening { child, url, base }
    }
}

impl Listening {
    /// SIGTERM, then the exit status (within 60 s).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("-TERM");
        self.wait_exit()
    }

    /// Send the gateway a signal (`-TERM`, `-KILL`).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    /// Its exit status, within 60 s.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the gateway did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A JSON-RPC request, as a Streamable HTTP client sends it.
    pub fn post(&self, token: Option<&str>, headers: &[(&str, &str)], body: &Value) -> Answer {
        post(&self.url, token, headers, &body.to_string())
    }

    /// `tools/call refund_order` with `args` under the operation key `key`, with a bearer `token`.
    pub fn call(&self, token: Option<&str>, key: Option<&str>, args: Value) -> Answer {
        self.post(token, &[], &call_body("refund_order", args, key))
    }

    /// A GET on the gateway (`/healthz`, `/metrics`): (status, body).
    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut req = agent().get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut r = req.call().expect("GET");
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tools/call` request body.
pub fn call_body(tool: &str, args: Value, key: Option<&str>) -> Value {
    let mut params = json!({"name": tool, "arguments": args});
    if let Some(key) = key {
        params["_meta"] = json!({"once/key": key});
    }
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
}

/// An HTTP client that shows every status as it is.
pub fn agent() -> Agent {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// POST `body` to `url` with a bearer `token` and read the answer whole; an error when the connection
/// failed or broke off (a client cut off by a gateway's shutdown).
pub fn try_post(url: &str, token: Option<&str>, body: &str) -> Result<String, ureq::Error> {
    request(url, token, &[]).send(body)?.body_mut().read_to_string()
}

/// A POST to `url` with a Streamable HTTP client's headers, a bearer `token` and `headers`.
fn request(
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
    let mut req = agent()
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req
}

/// POST `body` to `url` as a Streamable HTTP client does.
pub fn post(url: &str, token: Option<&str>, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut r = request(url, token, headers).send(body).expect("POST");
    let status = r.status().as_u16();
    let www_authenticate = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string());
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let body = r.body_mut().read_to_string().unwrap();
    let message = if sse {
        body.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id").is_some())
    } else {
        serde_json::from_str(&body).ok()
    };
    Answer {
        status,
        www_authenticate,
        message,
        body,
    }
}

/// The SHA-256 of `token` in hex, as `[http] tenants` stores it.
pub fn sha256_hex(token: &str) -> String {
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(token.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The README's tenant config as a user makes it: `examples/refund/once.toml` plus the lines the README
/// appends (`cat >> once-http.toml <<'TOML'`), read from the README itself, so the test runs what it prints.
pub fn readme_tenant_config() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (_, rest) = readme
        .split_once("cat >> once-http.toml <<'TOML'\n")
        .expect("the README appends the tenant lines to once-http.toml");
    let appended: Vec<&str> = rest
        .lines()
        .take_while(|l| l.trim() != "TOML")
        .map(str::trim_start)
        .collect();
    let example = std::fs::read_to_string(super::EXAMPLE_CONFIG).unwrap();
    format!("{example}\n{}\n", appended.join("\n"))
}

/// Raw HTTP/1.1 over 127.0.0.1, for what a well-behaved client never sends.
pub mod raw {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    /// `http://127.0.0.1:PORT` -> `127.0.0.1:PORT`.
    pub fn addr(base: &str) -> String {
        base.trim_start_matches("http://").to_string()
    }

    /// A POST to /mcp with `extra` header lines (each ending `\r\n`) and `body`, closing after the answer.
    pub fn post_mcp(extra: &str, body: &str) -> String {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json, text/event-stream\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
            body.len()
        )
    }

    /// Send `request` whole and read the answer to its end: (status, head, body).
    pub fn exchange(base: &str, request: &str) -> (u16, String, String) {
        exchange_within(base, request, Duration::from_secs(30))
    }

    /// As [`exchange`], failing when the connection or the answer takes longer than `limit`.
    pub fn exchange_within(base: &str, request: &str, limit: Duration) -> (u16, String, String) {
        let mut s = TcpStream::connect_timeout(&addr(base).parse().unwrap(), limit).unwrap();
        s.set_read_timeout(Some(limit)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap_or_else(|e| {
            panic!(
                "no whole answer within {limit:?}: {e}; had {:?}",
                String::from_utf8_lossy(&answer)
            )
        });
        split(&String::from_utf8_lossy(&answer))
    }

    /// (status, head, body) of a whole HTTP/1.1 answer.
    pub fn split(answer: &str) -> (u16, String, String) {
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
        (status, head.to_string(), body.to_string())
    }
}
