//! `once ui`: serve the operator's page over a ledger.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use once::Once;
use once_ui::{Access, Operator, Ui};

use crate::Failure;

/// `once ui [--db …] [--listen 127.0.0.1:PORT] [--operators FILE | --token T] [--behind-tls]`
#[derive(clap::Args)]
pub struct UiArgs {
    /// The ledger: an SQLite file, or a PostgreSQL URL.
    #[arg(long, env = "ONCE_DB", default_value = "once.db")]
    db: String,
    /// Where to listen (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8377")]
    listen: SocketAddr,
    /// Allow a listen address other than loopback (put TLS in front of it).
    #[arg(long)]
    public: bool,
    /// Browsers reach the page over HTTPS (a TLS-terminating proxy in front): the session cookie is Secure.
    #[arg(long)]
    behind_tls: bool,
    /// How long a browser stays signed in, in seconds.
    #[arg(long, default_value_t = once_ui::DEFAULT_SESSION_LIFETIME.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    session_lifetime_secs: u64,
    /// Operators and the scopes each may see (TOML, tokens as SHA-256); without it, one operator with --token.
    #[arg(long, conflicts_with = "token")]
    operators: Option<PathBuf>,
    /// The one operator's token [default: a random one, printed at start].
    #[arg(long, env = "ONCE_UI_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Most pending records one queue examines.
    #[arg(long, default_value_t = once_ui::DEFAULT_LIMIT)]
    limit: u32,
}

pub fn run(args: UiArgs) -> Result<(), Failure> {
    let bad = |message: String| Failure { code: 2, message };
    if !args.public && !once_ui::is_loopback(&args.listen) {
        return Err(bad(format!(
            "--listen {} is not a loopback address: the page resolves records, so it stays on 127.0.0.1 \
             unless you pass --public (and put TLS in front of it)",
            args.listen
        )));
    }
    let (operators, printed_token) = match &args.operators {
        Some(path) => (once_ui::load_operators(path).map_err(|e| bad(e.to_string()))?, None),
        None => {
            let token = match &args.token {
                Some(t) if t.trim().is_empty() => return Err(bad("--token is empty".into())),
                Some(t) => t.trim().to_string(),
                None => once_ui::random_token().map_err(io_failure(None))?,
            };
            let operator = Operator {
                name: "operator".into(),
                token_sha256: once_ui::token_sha256(&token),
                scopes: None,
            };
            (vec![operator], args.token.is_none().then_some(token))
        }
    };
    let once = Arc::new(Once::open(&args.db)?.build()?);
    let access = Access::new(operators).map_err(io_failure(None))?;
    let ui = Ui::new(once, access)
        .limit(args.limit)
        .secure_cookie(args.behind_tls)
        .session_lifetime(std::time::Duration::from_secs(args.session_lifetime_secs));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io_failure(Some("starting the server runtime")))?;
    runtime.block_on(async move {
        let listening = format!("listening on {}", args.listen);
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(io_failure(Some(&listening)))?;
        let addr = listener.local_addr().map_err(io_failure(None))?;
        // The first line is the address to open (tests and scripts read it). The token is beside it, never in
        // it: an address with the token would be kept in the browser's history. A closed stdout must not stop
        // the server, so a failed write is ignored.
        let first = match &printed_token {
            Some(token) => format!("once ui: http://{addr}/ (sign in with the operator token: {token})"),
            None => format!("once ui: http://{addr}/ (sign in with your operator token)"),
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{first}");
        let _ = writeln!(
            out,
            "ledger {}; metrics at http://{addr}/metrics (Authorization: Bearer <token>)",
            without_password(&args.db)
        );
        let _ = out.flush();
        drop(out);
        once_ui::serve(listener, ui).await;
        Ok(())
    })
}

/// A failed system call as the CLI reports it (exit code 1), after what was being done.
fn io_failure(doing: Option<&str>) -> impl FnOnce(std::io::Error) -> Failure + '_ {
    move |e| Failure {
        code: 1,
        message: doing.map_or_else(|| e.to_string(), |d| format!("{d}: {e}")),
    }
}

/// A ledger location fit to print: a URL's password replaced by `***`.
fn without_password(db: &str) -> String {
    let Some((scheme, rest)) = db.split_once("://") else {
        return db.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => db.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_printed_ledger_url_keeps_no_password() {
        use super::without_password;
        assert_eq!(
            without_password("postgres://u:s3cret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(without_password("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(without_password("once.db"), "once.db");
    }
}
