//! `once.toml`: what the gateway is told about the upstream's tools, mapped onto
//! engine policies. Nothing here decides a route, an identity or a state: the
//! file becomes `ToolPolicy` values that the component checks and applies.
//! A tool's `lookup` table (its templates and evidence) is [`crate::lookup`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use once::types::{IdentityMode, QuotaPolicy, Route, ToolPolicy};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::lookup::{Lookup, LookupSection};

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

/// A duration in milliseconds, written as `"500ms"`, `"2s"`, `"15m"`, `"1h"`, `"7d"` or a bare integer of ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Millis(pub(crate) u64);

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
                && crate::lookup::reads_key(lookup)
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
