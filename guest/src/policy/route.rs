//! Routing: DIRECT, PROTECT or BLOCK, from a pin, the policy, then MCP annotations.

use alloc::format;
use alloc::string::{String, ToString};

use super::Policy;
use crate::canon::{self, Value};
use crate::digest::sha256_jcs;
use crate::types::{BlockReason, Error, Route, Settings, ToolDescriptor};

/// How a tool routes, with the reason when it is blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routing {
    /// Read-only: no record.
    Direct,
    /// The full protocol.
    Protect,
    /// Refused.
    Block(BlockReason, String),
}

impl Routing {
    /// The WIT route.
    pub fn route(&self) -> Route {
        match self {
            Routing::Direct => Route::Direct,
            Routing::Protect => Route::Protect,
            Routing::Block(..) => Route::Block,
        }
    }
}

/// Route a tool: a descriptor pin first, then explicit policy, then MCP
/// annotations. An unclassified tool protects; it never becomes direct.
pub fn route(policy: &Policy, descriptor: Option<&ToolDescriptor>, settings: &Settings) -> Result<Routing, Error> {
    if let Some(pin) = &policy.descriptor_pin {
        let Some(descriptor) = descriptor else {
            return Ok(Routing::Block(
                BlockReason::DescriptorChanged,
                "the policy pins the tool's descriptor but none was supplied".to_string(),
            ));
        };
        let actual = descriptor_fingerprint(descriptor, settings)?;
        if &actual != pin {
            return Ok(Routing::Block(
                BlockReason::DescriptorChanged,
                format!(
                    "tool {:?} changed: descriptor fingerprint {actual}, pinned {pin}",
                    descriptor.name
                ),
            ));
        }
    }
    if let Some(route) = policy.route {
        return Ok(match route {
            Route::Direct => Routing::Direct,
            Route::Protect => Routing::Protect,
            Route::Block => Routing::Block(BlockReason::RouteBlocked, "the policy blocks this tool".to_string()),
        });
    }
    let Some(annotations) = descriptor.and_then(|d| d.annotations.as_deref()) else {
        return Ok(Routing::Protect);
    };
    let annotations =
        canon::parse(annotations.as_bytes(), &crate::input::limits(settings)).map_err(crate::input::json_error)?;
    let hint = |name: &str| match annotations.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("annotation {name} is not a boolean")),
    };
    let (read_only, destructive) = match (hint("readOnlyHint"), hint("destructiveHint")) {
        (Ok(r), Ok(d)) => (r, d),
        (Err(e), _) | (_, Err(e)) => return Ok(Routing::Block(BlockReason::RouteBlocked, e)),
    };
    Ok(match (read_only, destructive) {
        (Some(true), Some(true)) => Routing::Block(
            BlockReason::RouteBlocked,
            "contradictory annotations: readOnlyHint and destructiveHint are both true".to_string(),
        ),
        // A tool the user holds for a person's approval is never sent unrecorded on its server's word.
        (Some(true), _) if policy.approval.is_never() => Routing::Direct,
        _ => Routing::Protect,
    })
}

/// `sha256(JCS({"name":…, "inputSchema":…, "annotations":…}))` of a tool descriptor.
pub fn descriptor_fingerprint(descriptor: &ToolDescriptor, settings: &Settings) -> Result<String, Error> {
    let limits = crate::input::limits(settings);
    let schema = canon::parse(descriptor.input_schema.as_bytes(), &limits).map_err(crate::input::json_error)?;
    let annotations = match &descriptor.annotations {
        Some(text) => canon::parse(text.as_bytes(), &limits).map_err(crate::input::json_error)?,
        None => Value::Null,
    };
    let members = alloc::vec![
        ("name".to_string(), Value::String(descriptor.name.clone())),
        ("inputSchema".to_string(), schema),
        ("annotations".to_string(), annotations),
    ];
    Ok(sha256_jcs(&Value::Object(members)))
}
