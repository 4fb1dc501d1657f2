//! The bench's Python side: a venv of pinned packages under the target directory, a Redis check, and
//! running `python/bench/peer.py` in that venv.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::Stop;

/// The pinned requirements, relative to the repository root.
const REQUIREMENTS: &str = "python/bench/requirements-peer.txt";
/// The component this crate embeds: the Python package gets the same bytes (no nested cargo build).
const COMPONENT: &str = env!("ONCE_COMPONENT_PATH");

/// A venv with the pinned packages and the working tree's once-exactly.
pub struct Venv {
    python: PathBuf,
    root: PathBuf,
}

impl Venv {
    /// Reuse `dir` if it was made from the current requirements file, else make it anew; then install
    /// `./python` (always: the row must measure the working tree's package).
    pub fn prepare(root: &Path, dir: &Path) -> Result<Venv, Stop> {
        let requirements = std::fs::read_to_string(root.join(REQUIREMENTS))
            .map_err(|e| Stop::Fail(format!("reading {REQUIREMENTS}: {e}")))?;
        let stamp = dir.join("once-requirements.txt");
        let python = dir.join("bin/python");
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(requirements.as_str()) || !python.exists() {
            let base = std::env::var("ONCE_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
            let made = Command::new(&base).args(["-m", "venv", "--clear"]).arg(dir).output();
            match made {
                Err(e) => return Err(Stop::Skip(format!("{base} cannot run ({e}); set ONCE_PEER_PYTHON"))),
                Ok(out) if !out.status.success() => {
                    return Err(Stop::Skip(format!("{base} -m venv failed: {}", tail(&out))));
                }
                Ok(_) => {}
            }
            let out = pip(&python, root)
                .args(["--retries", "1", "--timeout", "20", "-r", REQUIREMENTS])
                .output()
                .map_err(|e| Stop::Fail(format!("running pip: {e}")))?;
            if !out.status.success() {
                return Err(Stop::Skip(format!(
                    "the pinned packages cannot be installed: {}",
                    tail(&out)
                )));
            }
            std::fs::write(&stamp, &requirements).map_err(|e| Stop::Fail(format!("writing {stamp:?}: {e}")))?;
        }
        // No index is needed from here on: dependencies and the build backend are pinned above.
        let out = pip(&python, root)
            .args(["--no-deps", "--no-build-isolation", "--force-reinstall", "./python"])
            .env("ONCE_COMPONENT", COMPONENT)
            .output()
            .map_err(|e| Stop::Fail(format!("running pip: {e}")))?;
        if !out.status.success() {
            return Err(Stop::Fail(format!("pip install ./python failed: {}", tail(&out))));
        }
        Ok(Venv {
            python,
            root: root.to_path_buf(),
        })
    }

    /// Run the timing script (or its profile): its stdout lines, and why it failed if it did (the lines
    /// before a failure are still rows measured); its stderr passes through.
    pub fn run_script(
        &self,
        script: &Path,
        dir: &Path,
        calls: u32,
        batches: u32,
        redis: Option<&str>,
        profile: bool,
    ) -> Result<(Vec<String>, Option<String>), Stop> {
        let mut cmd = Command::new(&self.python);
        cmd.arg(script)
            .args(["--calls", &calls.to_string(), "--batches", &batches.to_string()])
            .arg("--dir")
            .arg(dir)
            .current_dir(&self.root)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(at) = redis {
            cmd.args(["--redis", at]);
        }
        if profile {
            cmd.arg("--profile");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Stop::Fail(format!("running {script:?}: {e}")))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| Stop::Fail(format!("reading {script:?}'s output: {e}")))?;
            // Progress as it comes: a long row is visibly running.
            eprintln!("peer: {line}");
            lines.push(line);
        }
        let status = child
            .wait()
            .map_err(|e| Stop::Fail(format!("waiting for {script:?}: {e}")))?;
        let failed = (!status.success()).then(|| format!("{script:?} exited with {status} (its error is above)"));
        Ok((lines, failed))
    }
}

/// `python -m pip install` with quiet, non-interactive flags, run from the repository root.
fn pip(python: &Path, root: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
    ])
    .current_dir(root);
    cmd
}

/// The last lines of a failed command's output, for the printed reason.
fn tail(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" / ")
}

/// Whether a Redis at `at` answers `PING` with `PONG`.
pub fn redis_answers(at: &str) -> Result<(), String> {
    let addr: SocketAddr = at.parse().map_err(|e| format!("{at}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
    let mut answer = [0u8; 7];
    stream
        .read_exact(&mut answer)
        .map_err(|e| format!("no answer to PING: {e}"))?;
    if &answer == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(format!("PING answered {:?}", String::from_utf8_lossy(&answer)))
    }
}
