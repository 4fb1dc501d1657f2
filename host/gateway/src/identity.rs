//! Who the upstream is. A record is bound to the upstream it was made for:
//! two gateways in front of the same server for two accounts (the key in
//! the environment, or on the command line) must never answer each other's
//! calls from each other's records, nor send each other's owed calls. The
//! identity is a digest of everything that can name the account — the
//! command and its arguments, the working directory, the inherited
//! environment, or the URL with its credentials — and is only ever stored
//! or shown as that digest. What messages, logs and the default owner show
//! of the upstream ([`shown`]) holds no argument and no credential.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::upstream::Target;

/// Environment variables that describe the terminal, session, service manager or machine the gateway
/// was started from, not the upstream: left out of the identity, so a gateway restarted from another
/// shell, by systemd (a new `INVOCATION_ID` each time) or in a recreated container is still the same
/// upstream. A variable missing here makes a restart look like another upstream, which is refused at
/// start (safe, but in the way: the refusal names the owner to set); a variable wrongly here would let
/// two accounts look alike, so only variables no server reads for its account belong.
const SESSION_VARIABLES: [&str; 44] = [
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "TERM",
    "COLORTERM",
    "COLUMNS",
    "LINES",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "TMUX",
    "TMUX_PANE",
    "STY",
    "WINDOW",
    "WINDOWID",
    "LS_COLORS",
    "PS1",
    "PS2",
    "PS4",
    "PROMPT_COMMAND",
    "HISTFILE",
    "DBUS_SESSION_BUS_ADDRESS",
    "SESSION_MANAGER",
    "DESKTOP_SESSION",
    "GDMSESSION",
    "MAIL",
    "HOSTNAME",
    "HOST",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "MANAGERPID",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "WT_SESSION",
    "WT_PROFILE_ID",
    "SECURITYSESSIONID",
    "INSIDE_EMACS",
    "VTE_VERSION",
    "GPG_TTY",
    "RUST_LOG",
    "RUST_BACKTRACE",
];

/// Variables under a session prefix that name where a server keeps its account's configuration and data
/// (the user's XDG base directories): they count. Not the search paths (`XDG_CONFIG_DIRS`,
/// `XDG_DATA_DIRS`), which desktop sessions and sandboxed hosts rewrite, nor `SSH_AUTH_SOCK`: its path
/// is new with every login (and every boot, on macOS), which would make each restart another
/// upstream, and it names a socket, not the keys its agent holds.
const ACCOUNT_VARIABLES: [&str; 3] = ["XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"];

/// Prefixes of such variables (and of once's own settings, which configure the gateway, not the upstream).
const SESSION_PREFIXES: [&str; 14] = [
    "SSH_",
    "XDG_",
    "TERM_",
    "ITERM_",
    "VSCODE_",
    "KITTY_",
    "KONSOLE_",
    "GNOME_",
    "ALACRITTY_",
    "WEZTERM_",
    "LISTEN_",
    "XPC_",
    "__CF",
    "ONCE_",
];

/// Whether an inherited variable names the upstream's account or configuration (it counts) or only the
/// session the gateway runs in (it does not).
fn counts(name: &str) -> bool {
    ACCOUNT_VARIABLES.contains(&name)
        || (!SESSION_VARIABLES.contains(&name) && !SESSION_PREFIXES.iter().any(|p| name.starts_with(p)))
}

/// The upstream's identity: SHA-256, in hex, of what names it. For a command: its arguments, the
/// working directory (relative paths in them resolve there) and every inherited environment
/// variable but the session's; for a URL: the URL as given, credentials and query included.
pub fn identity(target: &Target) -> String {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .filter(|(k, _)| counts(k))
        .collect();
    let cwd = std::env::current_dir().map_or_else(|_| String::new(), |d| d.to_string_lossy().into_owned());
    identity_of(target, &cwd, &env)
}

fn identity_of(target: &Target, cwd: &str, env: &BTreeMap<String, String>) -> String {
    let named = match target {
        Target::Command(command) => serde_json::json!({"command": command, "cwd": cwd, "env": env}),
        Target::Url(url) => serde_json::json!({"url": url.as_given()}),
    };
    let digest = Sha256::digest(named.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The upstream in messages and logs: a command's program and how many arguments it has (an argument
/// may be a credential), or the URL without credentials, query or fragment.
pub fn shown(target: &Target) -> String {
    match target {
        Target::Command(command) => match command.split_first() {
            None => "(no command)".to_string(),
            Some((program, [])) => program.clone(),
            Some((program, [_])) => format!("{program} (1 argument, not shown)"),
            Some((program, args)) => format!("{program} ({} arguments, not shown)", args.len()),
        },
        Target::Url(url) => url.shown().to_string(),
    }
}

/// The default owner: the program's name (or the URL as [`shown`]) and the identity's first 12 hex
/// digits, so two upstreams are two owners and neither name holds a secret.
pub fn default_owner(target: &Target, identity: &str) -> String {
    let name = match target {
        Target::Command(command) => command
            .first()
            .map(|p| {
                Path::new(p)
                    .file_name()
                    .map_or_else(|| p.clone(), |f| f.to_string_lossy().into_owned())
            })
            .unwrap_or_default(),
        Target::Url(url) => url.shown().to_string(),
    };
    format!("gateway {name} #{}", &identity[..12])
}

/// The default provider account: `upstream #` and the identity's first 12 hex digits (those the default
/// owner shows), so an upstream whose command, environment or URL changed (a rotated credential among
/// them) is another account, and a name that holds no secret. A gateway whose upstream is the same
/// account after such a change says so with `account = "upstream #…"` (the old digits) in its config. `identity`
/// may be those 12 digits alone (as the default owner shows them): the account is the same.
pub fn default_account(identity: &str) -> String {
    format!("upstream #{}", &identity[..12])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::UpstreamUrl;

    fn command(args: &[&str]) -> Target {
        Target::Command(args.iter().map(|s| s.to_string()).collect())
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn an_account_in_the_arguments_the_environment_or_the_url_is_another_upstream() {
        let base = identity_of(&command(&["srv", "--api-key=a"]), "/srv", &env(&[("KEY", "a")]));
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            identity_of(&command(&["srv", "--api-key=a"]), "/srv", &env(&[("KEY", "a")])),
            "stable"
        );
        for other in [
            identity_of(&command(&["srv", "--api-key=b"]), "/srv", &env(&[("KEY", "a")])),
            identity_of(&command(&["srv", "--api-key=a"]), "/srv", &env(&[("KEY", "b")])),
            identity_of(&command(&["srv", "--api-key=a"]), "/other", &env(&[("KEY", "a")])),
        ] {
            assert_ne!(base, other);
        }
        let url = |u: &str| Target::Url(UpstreamUrl::parse(u).unwrap());
        assert_ne!(
            identity_of(&url("http://a:1@h/mcp"), "", &env(&[])),
            identity_of(&url("http://a:2@h/mcp"), "", &env(&[]))
        );
        assert_ne!(
            identity_of(&url("http://h/mcp?token=1"), "", &env(&[])),
            identity_of(&url("http://h/mcp?token=2"), "", &env(&[]))
        );
    }

    #[test]
    fn the_session_is_not_the_upstream() {
        for name in [
            "PWD",
            "SHLVL",
            "TERM",
            "SSH_TTY",
            "SSH_CONNECTION",
            "SSH_AUTH_SOCK",
            "XDG_SESSION_ID",
            "XDG_RUNTIME_DIR",
            "XDG_ACTIVATION_TOKEN",
            "XDG_DATA_DIRS",
            "ONCE_LOG",
            "TERM_PROGRAM",
        ] {
            assert!(!counts(name), "{name}");
        }
        // Where a server keeps its account's configuration counts, whatever its prefix.
        for name in [
            "STRIPE_API_KEY",
            "HOME",
            "PATH",
            "DATABASE_URL",
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
        ] {
            assert!(counts(name), "{name}");
        }
    }

    #[test]
    fn nothing_shown_holds_an_argument_or_a_credential() {
        let secret = command(&["/usr/bin/env", "API_KEY=sk-live-1", "srv", "--token", "t0k"]);
        let shown = shown(&secret);
        assert_eq!(shown, "/usr/bin/env (4 arguments, not shown)");
        let owner = default_owner(&secret, &identity_of(&secret, "/", &env(&[])));
        assert!(
            owner.starts_with("gateway env #") && owner.len() == "gateway env #".len() + 12,
            "{owner}"
        );
        let url = Target::Url(UpstreamUrl::parse("http://ops:pw@mcp.internal:8931/mcp?token=abc").unwrap());
        let owner = default_owner(&url, &identity_of(&url, "", &env(&[])));
        assert!(!owner.contains("pw") && !owner.contains("abc"), "{owner}");
    }

    #[test]
    fn the_default_account_follows_the_credential_and_shows_the_owners_digits() {
        let old = identity_of(&command(&["srv"]), "/srv", &env(&[("API_KEY", "sk-2026-11")]));
        let rotated = identity_of(&command(&["srv"]), "/srv", &env(&[("API_KEY", "sk-2026-12")]));
        assert_ne!(
            default_account(&old),
            default_account(&rotated),
            "a rotated key is another account"
        );
        let account = default_account(&old);
        assert!(!account.contains("sk-2026"), "{account}");
        // The refusal at start rebuilds the old account from the old default owner's digits.
        let owner = default_owner(&command(&["srv"]), &old);
        assert_eq!(account, format!("upstream #{}", &owner[owner.len() - 12..]));
    }
}
