//! `once.toml`: what the gateway is told about the upstream's tools, mapped onto
//! engine policies. Nothing here decides a route, an identity or a state: the
//! file becomes `ToolPolicy` values that the component checks and applies.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use once::types::{Evidence, IdentityMode, QuotaPolicy, Route, ToolPolicy};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::{Map, Value};

/// `_meta` fields accepted as the operation key unless the file says otherwise.
pub const DEFAULT_KEY_META: [&str; 2] = ["once/key", "idempotencyKey"];
/// `_meta` field naming the key an operation supersedes.
pub const SUPERSEDES_META: &str = "once/supersedes";
/// `_meta` field acknowledging that a superseded original is confirmed.
pub const ACKNOWLEDGE_META: &str = "once/acknowledge-confirmed";
/// Slack beyond the dispatch timeout of a lease the file does not set. The gateway makes
/// sure its upstream is up before it claims, so this only covers claim to send.
const LEASE_SLACK_MS: u64 = 1_000;
/// Decimal places of a quota's minor unit when the file names none (cents).
const DEFAULT_DECIMALS: u8 = 2;
/// The scope of every call when the file names none: one stable tenant, so an operation
/// key means the same operation across connections, restarts and gateways on one ledger.
pub const DEFAULT_SCOPE: &str = "default";

/// The whole file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    db: Option<PathBuf>,
    scope: Option<String>,
    owner: Option<String>,
    key_meta: Option<Vec<String>>,
    clock_skew: Option<Millis>,
    in_flight_wait: Option<Millis>,
    sweep_interval: Option<Millis>,
    shutdown_grace: Option<Millis>,
    defaults: Option<ToolSection>,
    #[serde(default)]
    tools: BTreeMap<String, ToolSection>,
}

/// One `[tools.NAME]` table (or `[defaults]`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolSection {
    route: Option<RouteName>,
    identity: Option<IdentityName>,
    derived_window: Option<Millis>,
    provider_key: Option<String>,
    effect_fields: Option<Vec<String>>,
    timeout: Option<Millis>,
    lease: Option<Millis>,
    max_in_flight: Option<Millis>,
    provider_claims_key: Option<bool>,
    verify_first: Option<bool>,
    attempts: Option<u32>,
    resolve_deadline: Option<Millis>,
    reconcile_interval: Option<Millis>,
    retention: Option<Millis>,
    tombstone_retention: Option<Millis>,
    quota: Option<QuotaSection>,
    pin: Option<String>,
    on_tool_error: Option<OnToolError>,
    reconcile: Option<ReconcileMode>,
    lookup: Option<LookupSection>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RouteName {
    Protect,
    Direct,
    Block,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum IdentityName {
    Derived,
    Required,
}

/// What an `isError` tool result from the upstream means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnToolError {
    /// The tool may have acted before failing: the outcome is unknown (the default: never guess).
    #[default]
    Ambiguous,
    /// The server documents that an error result means nothing was done.
    Rejected,
}

/// Whether a PROTECT tool must be reconcilable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReconcileMode {
    /// Without a lookup, an unknown outcome waits for an operator.
    #[default]
    Optional,
    /// A lookup must be configured.
    Required,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaSection {
    field: String,
    ceiling: Ceiling,
    decimals: Option<u8>,
    window: Millis,
    bucket: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupSection {
    tool: String,
    #[serde(default)]
    args: Option<toml::Table>,
    found: String,
    receipt: Option<String>,
    read_position: String,
    timeout: Option<Millis>,
}

/// A duration in milliseconds, written as `"500ms"`, `"2s"`, `"15m"`, `"1h"`, `"7d"` or a bare integer of ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Millis(u64);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Millis, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Millis;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"500ms\", \"2s\", \"15m\", \"1h\", \"7d\" (or an integer of ms)")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Millis, E> {
                u64::try_from(v)
                    .map(Millis)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Millis, E> {
                Ok(Millis(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Millis, E> {
                parse_duration(v).map(Millis).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like \"500ms\", \"2s\", \"15m\", \"1h\" or \"7d\""))?;
    let scale = match unit.trim() {
        "ms" | "" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("{text:?}: unknown unit {other:?} (ms, s, m, h, d)")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{text:?} is too long"))
}

/// A quota ceiling: a decimal string, or an integer (a float would lose the decimal text).
#[derive(Debug, Clone)]
struct Ceiling(String);

impl<'de> Deserialize<'de> for Ceiling {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ceiling, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Ceiling;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string such as \"500.00\", or an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Ceiling, E> {
                Ok(Ceiling(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Ceiling, E> {
                Ok(Ceiling(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Ceiling, E> {
                Err(E::custom(
                    "write a fractional ceiling as a string (\"500.00\"): floats lose the decimal",
                ))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Ceiling, E> {
                Ok(Ceiling(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// How a call's scope is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeMode {
    /// The same scope for every call through this gateway (the default: `fixed:default`).
    Fixed(String),
    /// From a `_meta` field of each call; a call without it is refused.
    Meta(String),
    /// One scope per client connection, chosen explicitly: after a restart, the same key
    /// is a new operation.
    Session,
}

/// Where the provider key travels on each dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKey {
    /// Not configured: the engine overwrites `idempotency_key` / `idempotencyKey` when the args have one.
    Default,
    /// The engine sets this argument to the provider key.
    Argument(String),
    /// The gateway puts the provider key in this `_meta` field of the upstream request.
    Meta(String),
}

/// Where a lookup's read position comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPosition {
    /// A JSON pointer to a number of ms since the Unix epoch in the answer.
    Pointer(String),
    /// The moment the gateway sent the lookup (only for a linearizable read).
    Sent,
}

/// The authoritative read of a PROTECT tool: a read-only tool on the upstream.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// The upstream tool to call.
    pub tool: String,
    /// Its arguments: a template with `{key}` (the provider key) and `{args/POINTER}` (the call's arguments).
    pub args: Value,
    /// Pointer to a boolean in the answer: true is confirmed, false absent, anything else unknown.
    pub found: String,
    /// Pointer to the receipt in the answer (default: the whole answer).
    pub receipt: String,
    /// Where the read position comes from.
    pub read_position: ReadPosition,
    /// Timeout of the lookup call.
    pub timeout: Duration,
}

/// What the gateway does for one tool: its engine policy and how to talk to the upstream about it.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The engine policy (the component checks it when it is set).
    pub policy: ToolPolicy,
    /// Where the provider key travels.
    pub provider_key: ProviderKey,
    /// What an `isError` result means.
    pub on_tool_error: OnToolError,
    /// The reconciliation read, if any.
    pub lookup: Option<Lookup>,
    /// The upstream call timeout (the policy's dispatch timeout).
    pub timeout: Duration,
}

/// The gateway's configuration, read and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from (for messages).
    pub source: String,
    /// The ledger named in the file.
    pub db: Option<PathBuf>,
    /// How scopes are chosen.
    pub scope: ScopeMode,
    /// Who dispatches this gateway's operations (`owner`; default: the upstream command line).
    pub owner: Option<String>,
    /// `_meta` fields carrying the operation key; every one present is passed to the engine.
    pub key_meta: Vec<String>,
    /// Declared clock skew bound, ms.
    pub clock_skew_ms: u64,
    /// How long a call waits for another attempt's outcome.
    pub in_flight_wait: Duration,
    /// How often the background reconciler looks at the ledger.
    pub sweep_interval: Duration,
    /// How long, after the client hangs up, unsettled operations are still reconciled.
    pub shutdown_grace: Duration,
    defaults: ToolSection,
    tools: BTreeMap<String, ToolSection>,
}

impl Default for Config {
    fn default() -> Config {
        Config::from_file(File::default(), "the built-in defaults".to_string()).expect("the defaults are valid")
    }
}

impl Config {
    /// Read and check `path`; every message names the file and the table.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parse and check a config text.
    pub fn parse(text: &str, source: &str) -> Result<Config, String> {
        let file: File = toml::from_str(text).map_err(|e| format!("{source}: {}", e.to_string().trim_end()))?;
        Config::from_file(file, source.to_string())
    }

    fn from_file(file: File, source: String) -> Result<Config, String> {
        let scope = match file.scope.as_deref() {
            None => ScopeMode::Fixed(DEFAULT_SCOPE.to_string()),
            Some("session") => ScopeMode::Session,
            Some(s) => match s.split_once(':') {
                Some(("fixed", name)) if !name.is_empty() => ScopeMode::Fixed(name.to_string()),
                Some(("meta", field)) if !field.is_empty() => ScopeMode::Meta(field.to_string()),
                _ => {
                    return Err(format!(
                        "{source}: scope {s:?} must be \"session\", \"fixed:NAME\" or \"meta:FIELD\""
                    ));
                }
            },
        };
        let key_meta = file
            .key_meta
            .unwrap_or_else(|| DEFAULT_KEY_META.iter().map(|s| s.to_string()).collect());
        if key_meta.iter().any(String::is_empty) {
            return Err(format!("{source}: key_meta has an empty field name"));
        }
        if file.owner.as_deref().is_some_and(|o| o.trim().is_empty()) {
            return Err(format!("{source}: owner is empty"));
        }
        let config = Config {
            source,
            db: file.db,
            scope,
            owner: file.owner,
            key_meta,
            clock_skew_ms: file.clock_skew.map_or(0, |m| m.0),
            in_flight_wait: ms(file.in_flight_wait.map_or(10_000, |m| m.0)),
            sweep_interval: ms(file.sweep_interval.map_or(200, |m| m.0).max(10)),
            shutdown_grace: ms(file.shutdown_grace.map_or(30_000, |m| m.0)),
            defaults: file.defaults.unwrap_or_default(),
            tools: file.tools,
        };
        config.check_static()?;
        Ok(config)
    }

    /// The tools the file names, in order.
    pub fn named_tools(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Whether the file gives `tool` an explicit route.
    pub fn routes_explicitly(&self, tool: &str) -> bool {
        self.tools.get(tool).is_some_and(|t| t.route.is_some())
    }

    /// Checks that need no upstream: table contents, pointers, templates.
    fn check_static(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut check = |table: &str, section: &ToolSection, is_defaults: bool| {
            let mut err = |m: String| errors.push(format!("{}: [{table}]: {m}", self.source));
            if is_defaults {
                for (set, name) in [
                    (section.route.is_some(), "route"),
                    (section.lookup.is_some(), "lookup"),
                    (section.pin.is_some(), "pin"),
                    (section.effect_fields.is_some(), "effect_fields"),
                    (section.quota.is_some(), "quota"),
                ] {
                    if set {
                        err(format!("{name} belongs to one tool's table, not [defaults]"));
                    }
                }
            }
            if let Some(pk) = &section.provider_key
                && let Err(e) = parse_provider_key(pk)
            {
                err(e);
            }
            for field in section.effect_fields.iter().flatten() {
                if let Err(e) = check_pointer(field) {
                    err(format!("effect_fields: {e}"));
                }
            }
            if let Some(q) = &section.quota
                && let Err(e) = check_pointer(&q.field)
            {
                err(format!("quota.field: {e}"));
            }
            if let Some(lookup) = &section.lookup
                && let Err(e) = Lookup::from_section(lookup)
            {
                err(format!("lookup: {e}"));
            }
            let reconcile = section.reconcile.or(self.defaults.reconcile).unwrap_or_default();
            if !is_defaults && reconcile == ReconcileMode::Required && section.lookup.is_none() {
                err(
                    "reconcile = \"required\" but no lookup is configured: add lookup = { tool = …, args = …, \
                     found = …, read_position = … }"
                        .to_string(),
                );
            }
            let carrier = section.provider_key.is_some() || self.defaults.provider_key.is_some();
            if !is_defaults
                && section.provider_claims_key.or(self.defaults.provider_claims_key) == Some(true)
                && !carrier
            {
                err(
                    "provider_claims_key = true, but the provider key never travels to the upstream, and a provider \
                     cannot claim a key it never saw: set provider_key = \"argument:NAME\" or \"meta:NAME\""
                        .to_string(),
                );
            }
            if let (Some(lookup), None) = (&section.lookup, &section.provider_key)
                && lookup_reads_key(lookup)
                && self.defaults.provider_key.is_none()
            {
                err(
                    "the lookup reads by {key}, but the provider key never travels to the upstream: set \
                     provider_key = \"argument:NAME\" or \"meta:NAME\""
                        .to_string(),
                );
            }
        };
        check("defaults", &self.defaults, true);
        for (name, section) in &self.tools {
            check(&format!("tools.{name}"), section, false);
        }
        // A shared bucket has one unit: tools that name it must agree (the engine refuses
        // a disagreeing spend at run time; here the file is refused before anything runs).
        let mut buckets: BTreeMap<&str, (&str, u8, u64)> = BTreeMap::new();
        for (name, q) in self.tools.iter().filter_map(|(n, t)| t.quota.as_ref().map(|q| (n, q))) {
            let bucket = q.bucket.as_deref().unwrap_or(name);
            let unit = (name.as_str(), q.decimals.unwrap_or(DEFAULT_DECIMALS), q.window.0);
            match buckets.get(bucket) {
                Some(&(first, decimals, window)) if (decimals, window) != (unit.1, unit.2) => errors.push(format!(
                    "{}: [tools.{name}]: quota bucket {bucket:?} counts in {decimals} decimal places over {window} ms \
                     in [tools.{first}], but here in {} over {} ms: a bucket has one unit",
                    self.source, unit.1, unit.2
                )),
                Some(_) => {}
                None => {
                    buckets.insert(bucket, unit);
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    }

    /// Checks against the upstream's tools: every named tool and lookup tool exists.
    pub fn check_tools(&self, upstream: &[String]) -> Result<(), String> {
        let known = |t: &str| upstream.iter().any(|u| u == t);
        let listing = upstream.join(", ");
        let mut errors = Vec::new();
        for (name, section) in &self.tools {
            if !known(name) {
                errors.push(format!(
                    "{}: [tools.{name}]: the upstream has no tool named {name:?} (it has: {listing})",
                    self.source
                ));
            }
            if let Some(lookup) = &section.lookup
                && !known(&lookup.tool)
            {
                errors.push(format!(
                    "{}: [tools.{name}]: lookup.tool {:?} is not a tool of the upstream (it has: {listing})",
                    self.source, lookup.tool
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n"))
        }
    }

    /// The plan of `tool`: engine default, then derived identity, then `[defaults]`, then `[tools.NAME]`.
    pub fn plan(&self, tool: &str, engine_default: &ToolPolicy) -> Result<ToolPlan, String> {
        let none = ToolSection::default();
        let own = self.tools.get(tool).unwrap_or(&none);
        let pick = |f: fn(&ToolSection) -> Option<Millis>| f(own).or(f(&self.defaults)).map(|m| m.0);
        let mut p = engine_default.clone();
        // The gateway's default: a call without an application key is deduplicated on its arguments.
        p.identity = IdentityMode::Derived;
        if let Some(identity) = own.identity.or(self.defaults.identity) {
            p.identity = match identity {
                IdentityName::Derived => IdentityMode::Derived,
                IdentityName::Required => IdentityMode::Required,
            };
        }
        p.route = own.route.map(|r| match r {
            RouteName::Protect => Route::Protect,
            RouteName::Direct => Route::Direct,
            RouteName::Block => Route::Block,
        });
        let provider_key = match own.provider_key.as_ref().or(self.defaults.provider_key.as_ref()) {
            Some(text) => parse_provider_key(text)?,
            None => ProviderKey::Default,
        };
        p.key_argument = match &provider_key {
            ProviderKey::Argument(name) => Some(name.clone()),
            _ => None,
        };
        p.key_sent_by_host = matches!(provider_key, ProviderKey::Meta(_));
        if let Some(t) = pick(|s| s.derived_window) {
            p.derived_window_ms = t;
        }
        p.effect_fields = own.effect_fields.clone();
        if let Some(t) = pick(|s| s.timeout) {
            p.dispatch_timeout_ms = t;
            p.lease_ms = t + LEASE_SLACK_MS + 2 * self.clock_skew_ms;
        }
        if let Some(t) = pick(|s| s.lease) {
            p.lease_ms = t;
        }
        if let Some(t) = pick(|s| s.max_in_flight) {
            p.max_in_flight_ms = t;
        }
        if let Some(b) = own.provider_claims_key.or(self.defaults.provider_claims_key) {
            p.provider_claims_key = b;
        }
        if let Some(b) = own.verify_first.or(self.defaults.verify_first) {
            p.verify_first = b;
        }
        if let Some(n) = own.attempts.or(self.defaults.attempts) {
            p.attempt_budget = n;
        }
        if let Some(t) = pick(|s| s.resolve_deadline) {
            p.resolve_deadline_ms = t;
        }
        if let Some(t) = pick(|s| s.reconcile_interval) {
            p.reconcile_interval_ms = t;
        }
        if let Some(t) = pick(|s| s.retention) {
            p.retention_ms = t;
            p.tombstone_retention_ms = p.tombstone_retention_ms.max(t);
        }
        if let Some(t) = pick(|s| s.tombstone_retention) {
            p.tombstone_retention_ms = t;
        }
        p.quota = own.quota.as_ref().map(|q| QuotaPolicy {
            spend_field: q.field.clone(),
            ceiling: q.ceiling.0.clone(),
            decimals: q.decimals.unwrap_or(DEFAULT_DECIMALS),
            window_ms: q.window.0,
            bucket: q.bucket.clone(),
        });
        p.descriptor_pin = own.pin.clone();
        let lookup = own.lookup.as_ref().map(Lookup::from_section).transpose()?;
        Ok(ToolPlan {
            timeout: ms(p.dispatch_timeout_ms),
            policy: p,
            provider_key,
            on_tool_error: own.on_tool_error.or(self.defaults.on_tool_error).unwrap_or_default(),
            lookup,
        })
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn parse_provider_key(text: &str) -> Result<ProviderKey, String> {
    match text.split_once(':') {
        Some(("argument", name)) if !name.is_empty() => Ok(ProviderKey::Argument(name.to_string())),
        Some(("meta", name)) if !name.is_empty() => Ok(ProviderKey::Meta(name.to_string())),
        _ => Err(format!(
            "provider_key {text:?} must be \"argument:NAME\" or \"meta:NAME\""
        )),
    }
}

/// RFC 6901 syntax: empty, or `/` segments where `~` is only `~0` or `~1`.
pub fn check_pointer(pointer: &str) -> Result<(), String> {
    if pointer.is_empty() {
        return Ok(());
    }
    if !pointer.starts_with('/') {
        return Err(format!("{pointer:?} is not a JSON pointer: it must start with \"/\""));
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "{pointer:?} is not a JSON pointer: \"~\" must be followed by 0 or 1"
            ));
        }
    }
    Ok(())
}

fn lookup_reads_key(section: &LookupSection) -> bool {
    let args = section.args.as_ref().and_then(|t| serde_json::to_value(t).ok());
    let mut reads = false;
    if let Some(args) = &args {
        let _ = walk_strings(args, &mut |text| {
            reads |= pieces(text).is_ok_and(|p| p.contains(&Piece::Key));
            Ok(())
        });
    }
    reads
}

/// One piece of a template string.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Key,
    Arg(String),
}

/// Split a template string; `{{` and `}}` are literal braces, every other `{…}` must be a placeholder.
fn pieces(text: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("{{") {
            literal.push('{');
            rest = r;
        } else if let Some(r) = rest.strip_prefix("}}") {
            literal.push('}');
            rest = r;
        } else if c == '{' {
            let end = rest
                .find('}')
                .ok_or_else(|| format!("{text:?}: unclosed \"{{\" (write \"{{{{\" for a brace)"))?;
            let name = &rest[1..end];
            let piece = match name {
                "key" => Piece::Key,
                "args" => Piece::Arg(String::new()),
                n if n.starts_with("args/") => {
                    let pointer = &n["args".len()..];
                    check_pointer(pointer).map_err(|e| format!("{text:?}: {e}"))?;
                    Piece::Arg(pointer.to_string())
                }
                other => {
                    return Err(format!(
                        "{text:?}: unknown placeholder {{{other}}} (use {{key}} or {{args/POINTER}})"
                    ));
                }
            };
            if !literal.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut literal)));
            }
            out.push(piece);
            rest = &rest[end + 1..];
        } else if c == '}' {
            return Err(format!("{text:?}: stray \"}}\" (write \"}}}}\" for a brace)"));
        } else {
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if !literal.is_empty() {
        out.push(Piece::Text(literal));
    }
    Ok(out)
}

impl Lookup {
    fn from_section(s: &LookupSection) -> Result<Lookup, String> {
        let args = match &s.args {
            Some(table) => serde_json::to_value(table).map_err(|e| format!("args: {e}"))?,
            None => Value::Object(Map::new()),
        };
        walk_strings(&args, &mut |text| pieces(text).map(|_| ()))?;
        check_pointer(&s.found).map_err(|e| format!("found: {e}"))?;
        let receipt = s.receipt.clone().unwrap_or_default();
        check_pointer(&receipt).map_err(|e| format!("receipt: {e}"))?;
        let read_position = if s.read_position == "sent" {
            ReadPosition::Sent
        } else {
            check_pointer(&s.read_position)
                .map_err(|e| format!("read_position: {e} (or \"sent\" for a linearizable read)"))?;
            ReadPosition::Pointer(s.read_position.clone())
        };
        Ok(Lookup {
            tool: s.tool.clone(),
            args,
            found: s.found.clone(),
            receipt,
            read_position,
            timeout: ms(s.timeout.map_or(5_000, |m| m.0)),
        })
    }

    /// The lookup's arguments for one operation (`{key}`: provider key, `{args/…}`: a dispatch argument).
    // A placeholder that is the whole string keeps the value's JSON type; inside text it is spliced as text.
    pub fn render(&self, provider_key: &str, args: &Value) -> Result<Value, String> {
        render(&self.args, provider_key, args)
    }

    /// What the lookup's answer says. A shape the file did not describe is unknown, never absent.
    pub fn evidence(&self, answer: &Value, sent_at: u64) -> Evidence {
        match answer.pointer(&self.found) {
            Some(Value::Bool(true)) => {
                let receipt = answer.pointer(&self.receipt).unwrap_or(answer);
                Evidence::Confirmed(receipt.to_string())
            }
            Some(Value::Bool(false)) => match &self.read_position {
                ReadPosition::Sent => Evidence::Absent(sent_at),
                ReadPosition::Pointer(p) => match answer.pointer(p).and_then(Value::as_u64) {
                    Some(position) => Evidence::Absent(position),
                    None => Evidence::Unknown(format!("{} answered absent without a read position at {p}", self.tool)),
                },
            },
            other => Evidence::Unknown(format!(
                "{} answered {} at {}, not a boolean",
                self.tool,
                other.map_or("nothing".to_string(), Value::to_string),
                if self.found.is_empty() { "the root" } else { &self.found }
            )),
        }
    }
}

fn walk_strings(value: &Value, f: &mut impl FnMut(&str) -> Result<(), String>) -> Result<(), String> {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().try_for_each(|v| walk_strings(v, f)),
        Value::Object(map) => map.values().try_for_each(|v| walk_strings(v, f)),
        _ => Ok(()),
    }
}

fn render(template: &Value, key: &str, args: &Value) -> Result<Value, String> {
    Ok(match template {
        Value::String(text) => {
            let pieces = pieces(text)?;
            let lookup = |pointer: &str| {
                args.pointer(pointer)
                    .cloned()
                    .ok_or_else(|| format!("the call has no argument at {pointer:?}"))
            };
            match pieces.as_slice() {
                [Piece::Key] => Value::String(key.to_string()),
                [Piece::Arg(p)] => lookup(p)?,
                _ => {
                    let mut out = String::new();
                    for piece in &pieces {
                        match piece {
                            Piece::Text(t) => out.push_str(t),
                            Piece::Key => out.push_str(key),
                            Piece::Arg(p) => match lookup(p)? {
                                Value::String(s) => out.push_str(&s),
                                other => out.push_str(&other.to_string()),
                            },
                        }
                    }
                    Value::String(out)
                }
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| render(v, key, args)).collect::<Result<_, _>>()?),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), render(v, key, args)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("2s"), Ok(2_000));
        assert_eq!(parse_duration("7d"), Ok(604_800_000));
        assert!(parse_duration("2 weeks").is_err());
    }

    #[test]
    fn templates_keep_types_and_substitute_text() {
        let t: Value = serde_json::json!({"k": "{key}", "o": "{args/order_id}", "s": "order-{args/order_id}/{key}"});
        let args = serde_json::json!({"order_id": 1234});
        let out = render(&t, "pk", &args).unwrap();
        assert_eq!(out, serde_json::json!({"k": "pk", "o": 1234, "s": "order-1234/pk"}));
        assert!(pieces("{nope}").is_err());
        assert!(pieces("{args/a~2}").is_err());
        assert_eq!(pieces("{{x}}").unwrap(), vec![Piece::Text("{x}".to_string())]);
    }

    /// The component's own default policy.
    fn engine_default() -> ToolPolicy {
        let once = once::Once::builder(once::storage::memory::MemoryStorage::new())
            .build()
            .unwrap();
        once.default_policy().unwrap()
    }

    #[test]
    fn a_tool_table_overrides_defaults_which_override_the_engine() {
        let config = Config::parse(
            r#"
            [defaults]
            retention = "2d"
            attempts = 5
            timeout = "4s"

            [tools.refund]
            retention = "3d"
            tombstone_retention = "30d"
            timeout = "2s"
            verify_first = true
            quota = { field = "/amount", ceiling = "500.00", window = "1d" }
            "#,
            "test.toml",
        )
        .unwrap();
        let engine = engine_default();
        let refund = config.plan("refund", &engine).unwrap().policy;
        assert_eq!(refund.retention_ms, 3 * 86_400_000);
        assert_eq!(refund.tombstone_retention_ms, 30 * 86_400_000);
        assert_eq!(refund.attempt_budget, 5, "from [defaults]");
        assert_eq!((refund.dispatch_timeout_ms, refund.lease_ms), (2_000, 3_000));
        assert!(refund.verify_first);
        assert_eq!(refund.quota.as_ref().map(|q| q.ceiling.as_str()), Some("500.00"));
        assert_eq!(
            refund.identity,
            IdentityMode::Derived,
            "the gateway derives keys by default"
        );

        let other = config.plan("other", &engine).unwrap().policy;
        assert_eq!(other.retention_ms, 2 * 86_400_000, "from [defaults]");
        // A retention past the engine's tombstone retention lifts it, so a pruned key stays refused.
        assert_eq!(other.tombstone_retention_ms, engine.tombstone_retention_ms);
        assert_eq!(other.max_in_flight_ms, engine.max_in_flight_ms, "unset: the engine's");
        assert!(other.quota.is_none() && !other.verify_first);
    }

    /// One stable scope unless the file says otherwise; `session` only when chosen.
    #[test]
    fn the_default_scope_is_one_named_tenant() {
        let config = Config::parse("", "empty.toml").unwrap();
        assert_eq!(config.scope, ScopeMode::Fixed(DEFAULT_SCOPE.to_string()));
        let session = Config::parse("scope = \"session\"", "s.toml").unwrap();
        assert_eq!(session.scope, ScopeMode::Session);
        let meta = Config::parse("scope = \"meta:tenant\"", "m.toml").unwrap();
        assert_eq!(meta.scope, ScopeMode::Meta("tenant".to_string()));
    }

    /// The derived window and the provider key's carrier reach the engine's policy.
    #[test]
    fn derived_window_and_carrier_are_part_of_the_policy() {
        let config = Config::parse(
            r#"
            [tools.a]
            derived_window = "2h"
            provider_key = "meta:once/provider-key"
            provider_claims_key = true
            [tools.b]
            provider_key = "argument:idempotency_key"
            "#,
            "test.toml",
        )
        .unwrap();
        let engine = engine_default();
        let a = config.plan("a", &engine).unwrap().policy;
        assert_eq!(a.derived_window_ms, 2 * 3_600_000);
        assert!(a.key_sent_by_host && a.provider_claims_key && a.key_argument.is_none());
        let b = config.plan("b", &engine).unwrap().policy;
        assert!(!b.key_sent_by_host);
        assert_eq!(b.key_argument.as_deref(), Some("idempotency_key"));
        assert_eq!(b.derived_window_ms, engine.derived_window_ms);
        // A provider cannot claim a key it never saw.
        let e = Config::parse("[tools.c]\nprovider_claims_key = true\n", "c.toml").unwrap_err();
        assert!(
            e.contains("provider_claims_key = true, but the provider key never travels"),
            "{e}"
        );
    }

    /// Two tools sharing a bucket in different units are refused at load.
    #[test]
    fn a_shared_bucket_in_two_units_is_refused() {
        let e = Config::parse(
            r#"
            [tools.payout]
            quota = { field = "/amount", ceiling = 500, decimals = 0, window = "1d", bucket = "money" }
            [tools.refund]
            quota = { field = "/amount", ceiling = "500.00", window = "1d", bucket = "money" }
            "#,
            "q.toml",
        )
        .unwrap_err();
        assert!(
            e.contains("[tools.refund]: quota bucket \"money\" counts in 0 decimal places over 86400000 ms in [tools.payout], but here in 2"),
            "{e}"
        );
    }

    #[test]
    fn pointers() {
        assert!(check_pointer("").is_ok());
        assert!(check_pointer("/a/~0/~1").is_ok());
        assert!(check_pointer("found").is_err());
        assert!(check_pointer("/a~").is_err());
    }
}
