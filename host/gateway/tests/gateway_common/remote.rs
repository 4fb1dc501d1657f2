//! A remote upstream for the gateway suites: `refund-mcp --listen` on a port
//! of 127.0.0.1 in front of a rig's effect ledger, killed with SIGKILL and
//! started again on the same port; and gateways that reach it by URL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Rig, Session, once_exe, refund_mcp};

/// `refund-mcp --listen` over an effect ledger: one process at a time, always on the same port.
pub struct RemoteUpstream {
    child: Option<Child>,
    addr: Option<SocketAddr>,
    effects: PathBuf,
    fault: String,
    log: PathBuf,
    starts: usize,
}

impl RemoteUpstream {
    /// Start it on a free port; `log` (with a start number) keeps each process's stderr.
    pub fn start(effects: &Path, fault: &str, log: PathBuf) -> RemoteUpstream {
        let mut upstream = RemoteUpstream {
            child: None,
            addr: None,
            effects: effects.to_path_buf(),
            fault: fault.to_string(),
            log,
            starts: 0,
        };
        upstream.restart();
        upstream
    }

    /// Where it listens, as a gateway's `--upstream-url`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr.expect("started"))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.expect("started").port()
    }

    fn log_of(&self, n: usize) -> PathBuf {
        self.log.with_extension(format!("{n}.log"))
    }

    /// Every process's stderr so far.
    pub fn logs(&self) -> String {
        (0..self.starts)
            .map(|n| std::fs::read_to_string(self.log_of(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// Start it again (after [`RemoteUpstream::kill`], or after a fault ended it) on the port it had; a
    /// fault fires only once per effect ledger, so a restarted server behaves normally.
    pub fn restart(&mut self) {
        if let Some(child) = self.child.as_mut() {
            assert!(child.try_wait().unwrap().is_some(), "already running");
            self.child = None;
        }
        let log = self.log_of(self.starts);
        self.starts += 1;
        let listen = self.addr.map_or("127.0.0.1:0".to_string(), |a| a.to_string());
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let child = Command::new(refund_mcp())
                .arg("--listen")
                .arg(&listen)
                .arg("--db")
                .arg(&self.effects)
                .args(["--mode", "unsafe", "--fault", &self.fault])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            self.child = Some(child);
            match self.wait_listening(&log) {
                Some(addr) => {
                    self.addr = Some(addr);
                    return;
                }
                // The port of a killed process can take a moment to be free again.
                None if Instant::now() < give_up => {
                    self.child.take().map(|mut c| c.wait());
                    std::thread::sleep(Duration::from_millis(100));
                }
                None => panic!("refund-mcp did not listen on {listen}:\n{}", self.logs()),
            }
        }
    }

    /// The address it printed once it accepts connections, or `None` if it exited first.
    fn wait_listening(&mut self, log: &Path) -> Option<SocketAddr> {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(rest) = text.split("listening on http://").nth(1) {
                let addr = rest.split('/').next().unwrap_or_default();
                return Some(addr.parse().unwrap_or_else(|e| panic!("{addr:?}: {e}")));
            }
            let child = self.child.as_mut().expect("spawned");
            if child.try_wait().unwrap().is_some() {
                return None;
            }
            assert!(Instant::now() < give_up, "refund-mcp never listened:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL it: the process dies with whatever it holds, its sessions with it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        let killed = Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let _ = child.wait();
    }
}

impl Drop for RemoteUpstream {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Rig {
    /// `once gateway --upstream-url URL` with this rig's config and ledger.
    pub fn url_gateway_command(&self, url: &str) -> Command {
        let mut cmd = Command::new(once_exe());
        cmd.arg("gateway")
            .arg("--config")
            .arg(&self.config)
            .arg("--db")
            .arg(&self.db)
            .arg("--upstream-url")
            .arg(url);
        cmd.env_remove("ONCE_DB").env("ONCE_LOG", "once=info");
        cmd
    }

    /// Start a gateway in front of the server at `url`, and connect an MCP client to it over stdio.
    pub async fn connect_url(&self, url: &str, n: usize) -> Session {
        self.connect_command(self.url_gateway_command(url), n).await
    }
}
