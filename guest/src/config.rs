//! What a host hands the guest once per instance: engine settings and every
//! tool's policy. Unset fields are filled here and everything is checked;
//! a call then names its tool and gets that tool's policy.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::engine::BeginRequest;
use crate::input::check_new_name;
use crate::policy::{Policy, Routing, resolve, route, unset};
use crate::types::{
    Call, Configuration, Configured, Error, LedgerEncoding, PolicyInput, ProviderReads, Settings, ToolDescriptor,
    ToolPlan,
};

/// The engine's default settings: 1 MiB JSON inputs, nesting depth 128,
/// 512-byte scopes and keys, no declared clock skew, owner `default`.
pub fn default_settings() -> Settings {
    Settings {
        max_input_bytes: 1 << 20,
        max_depth: 128,
        max_key_bytes: 512,
        clock_skew_ms: 0,
        owner: "default".to_string(),
    }
}

/// Settings and the tools' policies, every field decided.
#[derive(Debug, Clone)]
pub struct Config {
    /// Engine settings.
    pub settings: Settings,
    /// Which imports answer the ledger's `get` and `commit`.
    pub ledger_encoding: LedgerEncoding,
    /// How the protocol reads the provider ([`crate::reads`]).
    pub reads: ProviderReads,
    default_policy: Policy,
    tools: BTreeMap<String, (Policy, Option<ToolDescriptor>)>,
}

impl Config {
    /// Fill, check and index a host's configuration, and say how each tool is handled.
    pub fn new(configuration: Configuration) -> Result<(Config, Configured), Error> {
        let Configuration {
            settings,
            defaults,
            tools,
            ledger_encoding,
            reads,
        } = configuration;
        check_settings(&settings)?;
        let empty = unset();
        check_defaults(&defaults)?;
        let default_policy = resolve("(defaults)", &defaults, &empty, &settings)?;
        let mut plans = Vec::with_capacity(tools.len());
        let mut registry = BTreeMap::new();
        for tool in tools {
            check_new_name("tool", &tool.tool, &settings)?;
            if registry.contains_key(&tool.tool) {
                return Err(Error::InvalidPolicy(format!("tool {} is configured twice", tool.tool)));
            }
            let policy = resolve(&tool.tool, &tool.policy, &defaults, &settings)?;
            let routing = route(&policy, tool.descriptor.as_ref(), &settings)?;
            plans.push(ToolPlan {
                tool: tool.tool.clone(),
                route: routing.route(),
                blocked: match &routing {
                    Routing::Block(_, why) => Some(why.clone()),
                    _ => None,
                },
                policy: policy.to_wit(&tool.tool),
            });
            registry.insert(tool.tool, (policy, tool.descriptor));
        }
        check_buckets(&registry)?;
        let configured = Configured {
            defaults: default_policy.to_wit("(defaults)"),
            tools: plans,
            body_format: crate::body::BODY_FORMAT,
        };
        Ok((
            Config {
                settings,
                ledger_encoding,
                reads,
                default_policy,
                tools: registry,
            },
            configured,
        ))
    }

    /// The policy of `tool`: its own, else the defaults.
    pub fn policy(&self, tool: &str) -> &Policy {
        self.tools.get(tool).map_or(&self.default_policy, |(p, _)| p)
    }

    /// The begin request of a call: its tool's policy and definition.
    pub fn request(&self, call: Call) -> BeginRequest {
        let (policy, descriptor) = match self.tools.get(&call.tool) {
            Some((policy, descriptor)) => (policy.clone(), descriptor.clone()),
            None => (self.default_policy.clone(), None),
        };
        BeginRequest {
            scope: call.scope,
            keys: call.keys,
            tool: call.tool,
            args: call.args,
            policy,
            descriptor,
            supersedes: call.supersedes,
            acknowledge_confirmed: call.acknowledge_confirmed,
        }
    }
}

/// The fields that belong to one tool (its route, effect fields, quota and
/// pin) are refused in the defaults, never silently dropped.
fn check_defaults(defaults: &PolicyInput) -> Result<(), Error> {
    let per_tool = [
        ("route", defaults.route.is_some()),
        ("effect_fields", defaults.effect_fields.is_some()),
        ("quota", defaults.quota.is_some()),
        ("descriptor_pin", defaults.descriptor_pin.is_some()),
    ];
    match per_tool.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(Error::InvalidPolicy(format!(
            "defaults: {field} belongs to one tool's policy, not to the defaults"
        ))),
        None => Ok(()),
    }
}

fn check_settings(settings: &Settings) -> Result<(), Error> {
    let bad = |m: String| Err(Error::InvalidPolicy(m));
    if settings.max_input_bytes == 0 || settings.max_depth == 0 || settings.max_key_bytes == 0 {
        return bad("settings: max_input_bytes, max_depth and max_key_bytes must be positive".to_string());
    }
    if settings.owner.is_empty() || settings.owner.len() > settings.max_key_bytes as usize {
        return bad(format!(
            "settings: owner must be 1 to {} bytes, not {}",
            settings.max_key_bytes,
            settings.owner.len()
        ));
    }
    if settings.owner.chars().any(char::is_control) {
        return bad("settings: owner contains a control character".to_string());
    }
    Ok(())
}

/// A bucket shared by several tools has one unit: tools that disagree are refused at load.
fn check_buckets(tools: &BTreeMap<String, (Policy, Option<ToolDescriptor>)>) -> Result<(), Error> {
    let mut units: BTreeMap<String, (&str, u8, u64)> = BTreeMap::new();
    for (tool, (policy, _)) in tools {
        let Some(quota) = &policy.quota else { continue };
        let bucket = Policy::bucket_of(quota, tool);
        match units.get(&bucket) {
            Some(&(first, decimals, window)) if (decimals, window) != (quota.decimals, quota.window_ms) => {
                return Err(Error::InvalidPolicy(format!(
                    "tool {tool}: quota bucket {bucket:?} counts in {decimals} decimal places over {window} ms \
                     windows for tool {first}, but here in {} over {} ms: a bucket has one unit",
                    quota.decimals, quota.window_ms
                )));
            }
            Some(_) => {}
            None => {
                units.insert(bucket, (tool.as_str(), quota.decimals, quota.window_ms));
            }
        }
    }
    Ok(())
}
