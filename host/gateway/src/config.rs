//! `once.toml`: what the gateway is told about the upstream's tools. The file
//! becomes policy inputs — only what it sets — that the component fills in
//! and checks when it is configured (a lease from the timeout, retention and
//! tombstones, quota decimals, identity); nothing here computes a policy
//! value or decides a route. What is the gateway's own (where the provider
//! key travels, what an error result means, the lookup) is an
//! [`UpstreamTool`]; a `lookup` table's templates are [`crate::lookup`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use once::types::{ApprovalRule, ApprovalThreshold, IdentityMode, PolicyInput, QuotaInput, Route, ToolDescriptor};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::access::{HttpAccess, HttpSection};
use crate::lookup::{Lookup, LookupSection};
use crate::remote::UpstreamUrl;

/// `_meta` fields accepted as the operation key unless the file says otherwise.
pub const DEFAULT_KEY_META: [&str; 2] = ["once/key", "idempotencyKey"];
/// `_meta` field naming the key an operation supersedes.
pub const SUPERSEDES_META: &str = "once/supersedes";
/// `_meta` field acknowledging that a superseded original is confirmed.
pub const ACKNOWLEDGE_META: &str = "once/acknowledge-confirmed";
/// The scope of every call when the file names none: one stable tenant, so an operation
/// key means the same operation across connections, restarts and gateways on one ledger.
pub const DEFAULT_SCOPE: &str = "default";

/// The whole file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    db: Option<PathBuf>,
    upstream_url: Option<String>,
    scope: Option<String>,
    owner: Option<String>,
    account: Option<String>,
    key_meta: Option<Vec<String>>,
    clock_skew: Option<Millis>,
    in_flight_wait: Option<Millis>,
    sweep_interval: Option<Millis>,
    shutdown_grace: Option<Millis>,
    defaults: Option<ToolSection>,
    #[serde(default)]
    tools: BTreeMap<String, ToolSection>,
    http: Option<HttpSection>,
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
    approval: Option<ApprovalSection>,
    approval_valid: Option<Millis>,
    approval_wait: Option<Millis>,
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
    ceiling: Decimal,
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

/// An amount (a quota's ceiling, an approval's threshold): a decimal string, or an integer (a
/// float would lose the decimal text).
#[derive(Debug, Clone)]
struct Decimal(String);

impl<'de> Deserialize<'de> for Decimal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Decimal;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string such as \"500.00\", or an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Decimal, E> {
                Ok(Decimal(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Decimal, E> {
                Ok(Decimal(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Decimal, E> {
                Err(E::custom(
                    "write a fractional amount as a string (\"500.00\"): floats lose the decimal",
                ))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Decimal, E> {
                Ok(Decimal(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// When a person must approve a call before it is sent: `"never"`, `"always"`, or
/// `{ field = "/amount", above = "100.00" }` (above an amount at an effect field).
#[derive(Debug, Clone)]
enum ApprovalSection {
    Never,
    Always,
    Above { field: String, above: String },
}

impl<'de> Deserialize<'de> for ApprovalSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ApprovalSection, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Above {
            field: String,
            above: Decimal,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ApprovalSection;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"never\", \"always\", or a table { field = \"/amount\", above = \"100.00\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ApprovalSection, E> {
                match v {
                    "never" => Ok(ApprovalSection::Never),
                    "always" => Ok(ApprovalSection::Always),
                    other => Err(E::custom(format!(
                        "approval {other:?} must be \"never\", \"always\", or a table {{ field = \"/amount\", above = \"100.00\" }}"
                    ))),
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ApprovalSection, A::Error> {
                let a = Above::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ApprovalSection::Above {
                    field: a.field,
                    above: a.above.0,
                })
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ProviderKey {
    /// Not configured: the engine overwrites `idempotency_key` / `idempotencyKey` when the args have one.
    #[default]
    Default,
    /// The engine sets this argument to the provider key.
    Argument(String),
    /// The gateway puts the provider key in this `_meta` field of the upstream request.
    Meta(String),
}

/// How the gateway talks to the upstream about one tool; the engine decides everything else.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTool {
    /// Where the provider key travels.
    pub provider_key: ProviderKey,
    /// What an `isError` result means.
    pub on_tool_error: OnToolError,
    /// The reconciliation read, if any.
    pub lookup: Option<Lookup>,
}

/// The gateway's configuration, read and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from (for messages).
    pub source: String,
    /// The ledger named in the file.
    pub db: Option<PathBuf>,
    /// The upstream server's URL named in the file (`upstream_url`), instead of a command.
    pub upstream_url: Option<UpstreamUrl>,
    /// How scopes are chosen.
    pub scope: ScopeMode,
    /// Who dispatches this gateway's operations (`owner`; default: the upstream command line).
    pub owner: Option<String>,
    /// The provider account the upstream acts for (`account`, a name for it, never its credential;
    /// default: the upstream's identity digest, [`crate::identity::default_account`]).
    pub account: Option<String>,
    /// `_meta` fields carrying the operation key; every one present is passed to the engine.
    pub key_meta: Vec<String>,
    /// Declared clock skew bound, ms.
    pub clock_skew_ms: u64,
    /// How long a call waits for an outcome the engine says is coming (a holder's, a due read).
    pub in_flight_wait: Duration,
    /// How often the background reconciler looks at the ledger.
    pub sweep_interval: Duration,
    /// How long, after the client hangs up, unsettled operations are still reconciled.
    pub shutdown_grace: Duration,
    /// `[http]`: who may call the gateway over HTTP, and each request's tenant.
    pub http: HttpAccess,
    defaults: ToolSection,
    tools: BTreeMap<String, ToolSection>,
    /// Each named tool's dealings with the upstream.
    upstream_tools: BTreeMap<String, UpstreamTool>,
    /// A tool the file does not name: `[defaults]`' carrier and error meaning, no lookup.
    default_tool: UpstreamTool,
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
        if file.account.as_deref().is_some_and(|a| a.trim().is_empty()) {
            return Err(format!("{source}: account is empty"));
        }
        let http = HttpAccess::from_section(file.http.unwrap_or_default(), file.scope.as_deref())
            .map_err(|e| format!("{source}: {e}"))?;
        let upstream_url = match file.upstream_url.as_deref() {
            Some(text) => Some(UpstreamUrl::parse(text).map_err(|e| format!("{source}: upstream_url: {e}"))?),
            None => None,
        };
        let mut config = Config {
            source,
            db: file.db,
            upstream_url,
            scope,
            owner: file.owner,
            account: file.account,
            key_meta,
            clock_skew_ms: file.clock_skew.map_or(0, |m| m.0),
            in_flight_wait: ms(file.in_flight_wait.map_or(10_000, |m| m.0)),
            sweep_interval: ms(file.sweep_interval.map_or(200, |m| m.0).max(10)),
            shutdown_grace: ms(file.shutdown_grace.map_or(30_000, |m| m.0)),
            http,
            defaults: file.defaults.unwrap_or_default(),
            tools: file.tools,
            upstream_tools: BTreeMap::new(),
            default_tool: UpstreamTool::default(),
        };
        config.check_static()?;
        config.default_tool = config.upstream_tool_of(&ToolSection::default())?;
        for (name, section) in &config.tools {
            let tool = config.upstream_tool_of(section)?;
            config.upstream_tools.insert(name.clone(), tool);
        }
        Ok(config)
    }

    /// A tool's dealings with the upstream: its own table, then `[defaults]`.
    fn upstream_tool_of(&self, own: &ToolSection) -> Result<UpstreamTool, String> {
        let provider_key = match own.provider_key.as_ref().or(self.defaults.provider_key.as_ref()) {
            Some(text) => parse_provider_key(text)?,
            None => ProviderKey::Default,
        };
        Ok(UpstreamTool {
            provider_key,
            on_tool_error: own.on_tool_error.or(self.defaults.on_tool_error).unwrap_or_default(),
            lookup: own.lookup.as_ref().map(Lookup::from_section).transpose()?,
        })
    }

    /// `builder` configured as the file says: the clock skew, the wait for
    /// another attempt, `[defaults]`, and every tool the upstream lists
    /// (`descriptors`, for routing by annotations and pinning) or the file names;
    /// every tool sent and read through the provider `account` (none: not named).
    pub fn apply(
        &self,
        builder: once::Builder,
        descriptors: &[ToolDescriptor],
        account: Option<&str>,
    ) -> once::Builder {
        let mut builder = builder
            .clock_skew(ms(self.clock_skew_ms))
            .wait_up_to(self.in_flight_wait)
            .defaults(PolicyInput {
                provider_account: account.map(String::from),
                ..self.defaults_policy()
            });
        for d in descriptors {
            builder = builder.tool(d.name.clone(), self.policy(&d.name), Some(d.clone()));
        }
        for name in self.named_tools().filter(|n| !descriptors.iter().any(|d| d.name == *n)) {
            builder = builder.tool(name, self.policy(name), None);
        }
        builder
    }

    /// An engine refusal of the file's policies, said in the file's terms.
    pub fn refused(&self, e: &once::OnceError) -> String {
        let said = e.to_string();
        // The engine names the tool it refused ("tool NAME: …"); the file calls that a table.
        let table = std::iter::once(("(defaults)".to_string(), "[defaults]: ".to_string()))
            .chain(self.named_tools().map(|t| (t.to_string(), format!("[tools.{t}]: "))))
            .find(|(tool, _)| said.contains(&format!("tool {tool}: ")))
            .map_or_else(String::new, |(_, table)| table);
        format!(
            "{}: {table}{said} (once.toml names: timeout = dispatch_timeout_ms, lease = lease_ms, attempts = attempt_budget, \
             retention = retention_ms, tombstone_retention = tombstone_retention_ms, derived_window = \
             derived_window_ms, provider_key = key_argument / key_sent_by_host, pin = descriptor_pin, quota.field = \
             spend field, approval.field = approval field, approval_valid = approval_valid_ms, approval_wait = approval_wait_ms, \
             account = provider_account)",
            self.source
        )
    }

    /// How the gateway talks to the upstream about `tool`.
    pub fn upstream_tool(&self, tool: &str) -> &UpstreamTool {
        self.upstream_tools.get(tool).unwrap_or(&self.default_tool)
    }

    /// What `[defaults]` sets, for the engine to apply to every tool (the
    /// provider key's carrier travels with each tool's own policy instead, so
    /// a tool's carrier never mixes with another from `[defaults]`).
    pub fn defaults_policy(&self) -> PolicyInput {
        PolicyInput {
            // A lookup is one tool's: a tool without one has none.
            lookup: Some(false),
            ..policy_of(&self.defaults)
        }
    }

    /// What the file sets for `tool` (its table, and the carrier from `[defaults]`); the
    /// engine fills the rest from [`Config::defaults_policy`] and its own defaults.
    pub fn policy(&self, tool: &str) -> PolicyInput {
        let none = ToolSection::default();
        let own = self.tools.get(tool).unwrap_or(&none);
        let upstream = self.upstream_tool(tool);
        let (key_argument, key_sent_by_host) = match &upstream.provider_key {
            ProviderKey::Default => (None, None),
            ProviderKey::Argument(name) => (Some(name.clone()), Some(false)),
            ProviderKey::Meta(_) => (None, Some(true)),
        };
        PolicyInput {
            route: own.route.map(|r| match r {
                RouteName::Protect => Route::Protect,
                RouteName::Direct => Route::Direct,
                RouteName::Block => Route::Block,
            }),
            key_argument,
            key_sent_by_host,
            effect_fields: own.effect_fields.clone(),
            lookup: Some(upstream.lookup.is_some()),
            quota: own.quota.as_ref().map(|q| QuotaInput {
                spend_field: q.field.clone(),
                ceiling: q.ceiling.0.clone(),
                decimals: q.decimals,
                window_ms: q.window.0,
                bucket: q.bucket.clone(),
            }),
            descriptor_pin: own.pin.clone(),
            approval: own.approval.as_ref().map(|a| match a {
                ApprovalSection::Never => ApprovalRule::Never,
                ApprovalSection::Always => ApprovalRule::Always,
                ApprovalSection::Above { field, above } => ApprovalRule::Above(ApprovalThreshold {
                    field: field.clone(),
                    above: above.clone(),
                }),
            }),
            ..policy_of(own)
        }
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
                    (section.approval.is_some(), "approval"),
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
}

/// The policy fields a table sets that apply to any tool (the ones only a
/// tool's own table may set are added by [`Config::policy`]).
fn policy_of(section: &ToolSection) -> PolicyInput {
    let ms = |m: Option<Millis>| m.map(|m| m.0);
    PolicyInput {
        identity: section.identity.map(|i| match i {
            IdentityName::Derived => IdentityMode::Derived,
            IdentityName::Required => IdentityMode::Required,
        }),
        derived_window_ms: ms(section.derived_window),
        dispatch_timeout_ms: ms(section.timeout),
        lease_ms: ms(section.lease),
        max_in_flight_ms: ms(section.max_in_flight),
        provider_claims_key: section.provider_claims_key,
        verify_first: section.verify_first,
        attempt_budget: section.attempts,
        resolve_deadline_ms: ms(section.resolve_deadline),
        reconcile_interval_ms: ms(section.reconcile_interval),
        retention_ms: ms(section.retention),
        tombstone_retention_ms: ms(section.tombstone_retention),
        approval_valid_ms: ms(section.approval_valid),
        approval_wait_ms: ms(section.approval_wait),
        ..once::policy_input()
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

#[cfg(test)]
mod tests {
    use super::*;
    use once::Once;
    use once::storage::memory::MemoryStorage;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("2s"), Ok(2_000));
        assert_eq!(parse_duration("7d"), Ok(604_800_000));
        assert!(parse_duration("2 weeks").is_err());
    }

    /// The engine configured as `config` says, with no upstream.
    fn engine(config: &Config) -> Result<Once, once::OnceError> {
        config.apply(Once::builder(MemoryStorage::new()), &[], None).build()
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
            lookup = { tool = "find", args = { order = "{args/order}" }, found = "/found", read_position = "sent" }
            "#,
            "test.toml",
        )
        .unwrap();
        let once = engine(&config).unwrap();
        let bare = engine(&Config::default()).unwrap();
        let refund = once.policy("refund");
        assert_eq!(refund.retention_ms, 3 * 86_400_000);
        assert_eq!(refund.tombstone_retention_ms, 30 * 86_400_000);
        assert_eq!(refund.attempt_budget, 5, "from [defaults]");
        assert_eq!(refund.dispatch_timeout_ms, 2_000);
        assert!(
            refund.lease_ms > 2_000,
            "the engine derives a lease that covers the timeout"
        );
        assert!(refund.verify_first && refund.lookup);
        let quota = refund.quota.as_ref().unwrap();
        assert_eq!(
            (quota.ceiling.as_str(), quota.decimals),
            ("500.00", 2),
            "decimals from the engine"
        );
        assert_eq!(refund.identity, IdentityMode::Derived, "keys are derived by default");

        let other = once.policy("other");
        assert_eq!(other.retention_ms, 2 * 86_400_000, "from [defaults]");
        assert_eq!(other.dispatch_timeout_ms, 4_000, "from [defaults]");
        assert_eq!(
            other.tombstone_retention_ms,
            bare.policy("other").tombstone_retention_ms
        );
        assert_eq!(
            other.max_in_flight_ms,
            bare.policy("other").max_in_flight_ms,
            "unset: the engine's"
        );
        assert!(other.quota.is_none() && !other.verify_first && !other.lookup);
    }

    /// An inconsistent table is refused by the engine, in the file's terms, never adjusted.
    #[test]
    fn an_inconsistent_table_is_refused_not_adjusted() {
        let config = Config::parse("[tools.refund]\ntimeout = \"10s\"\nlease = \"5s\"\n", "l.toml").unwrap();
        let e = engine(&config).map(|_| ()).unwrap_err();
        let said = config.refused(&e);
        assert!(
            said.starts_with("l.toml: [tools.refund]: invalid policy: tool refund: lease_ms 5000"),
            "{said}"
        );
        assert!(said.contains("lease = lease_ms"), "{said}");
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
            [defaults]
            provider_key = "argument:idempotency_key"
            [tools.a]
            derived_window = "2h"
            provider_key = "meta:once/provider-key"
            provider_claims_key = true
            [tools.b]
            "#,
            "test.toml",
        )
        .unwrap();
        let once = engine(&config).unwrap();
        let a = once.policy("a");
        assert_eq!(a.derived_window_ms, 2 * 3_600_000);
        assert!(a.key_sent_by_host && a.provider_claims_key);
        assert_eq!(
            a.key_argument, None,
            "[defaults]' argument does not mix with a's own carrier"
        );
        let b = once.policy("b");
        assert!(!b.key_sent_by_host);
        assert_eq!(b.key_argument.as_deref(), Some("idempotency_key"), "from [defaults]");
        assert_eq!(
            b.derived_window_ms,
            engine(&Config::default()).unwrap().policy("b").derived_window_ms
        );
        // A provider cannot claim a key it never saw: the engine says so.
        let c = Config::parse("[tools.c]\nprovider_claims_key = true\n", "c.toml").unwrap();
        let e = config.refused(&engine(&c).map(|_| ()).unwrap_err());
        assert!(e.contains("tool c: provider_claims_key needs the provider key"), "{e}");
    }

    /// Two tools sharing a bucket in different units are refused when the engine is configured.
    #[test]
    fn a_shared_bucket_in_two_units_is_refused() {
        let config = Config::parse(
            r#"
            [tools.payout]
            quota = { field = "/amount", ceiling = 500, decimals = 0, window = "1d", bucket = "money" }
            [tools.refund]
            quota = { field = "/amount", ceiling = "500.00", window = "1d", bucket = "money" }
            "#,
            "q.toml",
        )
        .unwrap();
        let e = config.refused(&engine(&config).map(|_| ()).unwrap_err());
        assert!(
            e.contains("tool refund: quota bucket \"money\" counts in 0 decimal places"),
            "{e}"
        );
    }
}
