//! `once gateway --check-config`: every tool's policy through the engine's
//! own check, and the route each upstream tool gets, printed.

use once::Once;
use once::storage::memory::MemoryStorage;
use once::types::{IdentityMode, Route};

use crate::config::{Config, ProviderKey, ScopeMode};
use crate::handler::Shared;
use crate::{GatewayError, SESSION_SCOPE_WARNING};

/// `--check-config` without an upstream: the file's policies through the engine's own check.
pub(crate) fn check_static(config: &Config) -> Result<(), GatewayError> {
    let once = config
        .apply(Once::builder(MemoryStorage::new()), &[], None)
        .build()
        .map_err(|e| GatewayError::Config(config.refused(&e)))?;
    println!(
        "{}: ok (give the upstream command after `--` to check tool names and print every route)",
        config.source
    );
    if config.scope == ScopeMode::Session {
        println!("  warning: {SESSION_SCOPE_WARNING}");
    }
    for tool in config.named_tools() {
        if let Some(warning) = identity_warning(&once, tool) {
            println!("  warning: {warning}");
        }
    }
    for tool in config.named_tools() {
        let how = if config.routes_explicitly(tool) {
            "route set in the config"
        } else {
            "route from the upstream's annotations"
        };
        println!("  {tool}: {how}");
    }
    Ok(())
}

/// Every upstream tool's route and policy, as the engine configured them.
pub(crate) fn print_routes(shared: &Shared, once: &Once) -> Result<(), GatewayError> {
    let config = &shared.config;
    println!(
        "{}: ok; upstream `{}` lists {} tools; scope {}; owner {:?}; account {:?}",
        config.source,
        shared.upstream.shown(),
        shared.upstream.tools().len(),
        match &config.scope {
            ScopeMode::Session => "per session".to_string(),
            ScopeMode::Fixed(name) => format!("fixed {name:?}"),
            ScopeMode::Meta(field) => format!("from _meta {field:?} (a call without it is refused)"),
        },
        shared.owner,
        shared.account,
    );
    if config.scope == ScopeMode::Session {
        println!("warning: {SESSION_SCOPE_WARNING}");
    }
    if let Some(warning) = crate::account_warning(config, &shared.account) {
        println!("warning: {warning}");
    }
    for tool in shared.upstream.tools() {
        let name = tool.name.to_string();
        let plan = once.plan(&name);
        let upstream = config.upstream_tool(&name);
        let source = if config.routes_explicitly(&name) {
            "config".to_string()
        } else {
            match &tool.annotations {
                Some(a) => format!("annotations {}", serde_json::to_string(a).unwrap_or_default()),
                None => "no annotations: protected by default".to_string(),
            }
        };
        let mut line = format!("{name:<24} {:<8} {source}", plan.route.to_string());
        if let Some(why) = &plan.blocked {
            line.push_str(&format!("; {why}"));
        }
        if plan.route == Route::Protect {
            let p = &plan.policy;
            line.push_str(&format!(
                "; key: _meta {:?} or derived from the arguments; timeout {} ms, lease {} ms",
                config.key_meta, p.dispatch_timeout_ms, p.lease_ms
            ));
            match &upstream.provider_key {
                ProviderKey::Argument(a) => line.push_str(&format!("; provider key -> argument {a}")),
                ProviderKey::Meta(m) => line.push_str(&format!("; provider key -> _meta {m}")),
                ProviderKey::Default => {}
            }
            match &upstream.lookup {
                Some(l) => line.push_str(&format!("; reconciles via {}", l.tool)),
                None => line.push_str("; no lookup: an unknown outcome waits for an operator"),
            }
            if let Some(q) = &p.quota {
                line.push_str(&format!(
                    "; quota {} per {} ms on {} (bucket {})",
                    q.ceiling, q.window_ms, q.spend_field, q.bucket
                ));
            }
        }
        println!("{line}");
    }
    for tool in shared.upstream.tools() {
        if let Some(warning) = identity_warning(once, &tool.name) {
            println!("warning: {warning}");
        }
    }
    Ok(())
}

/// A protected tool whose keyless calls derive their key from every argument: a model that retries an
/// unknown outcome with one field reworded (a reason, a note, a request id it made up) starts a second
/// operation, and the effect may happen twice. Declaring the effect fields makes the rewording the same
/// operation.
pub(crate) fn identity_warning(once: &Once, tool: &str) -> Option<String> {
    let plan = once.plan(tool);
    let derived_from_everything = plan.route == Route::Protect
        && plan.blocked.is_none()
        && plan.policy.identity == IdentityMode::Derived
        && plan.policy.effect_fields.is_none();
    derived_from_everything.then(|| {
        format!(
            "{tool}: a call without an operation key is identified by all of its arguments, so a retry that \
             changes any of them (a reason, a note, an id the model made up) is a new operation and runs again; \
             declare what the effect is with effect_fields = [\"/field\", …] in [tools.{tool}], or require keys \
             with identity = \"required\""
        )
    })
}
