//! The effect-bearing payload of a call: what the fingerprint covers, what is
//! dispatched, and how much it spends.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::amount::{parse_decimal, parse_minor_units};
use crate::canon::{self, Value};
use crate::digest::sha256_jcs;
use crate::input::{json_error, limits};
use crate::policy::key_argument_names;
use crate::policy::{ApprovalRule, Policy};
use crate::types::{BlockReason, Error, Settings};

/// A parsed call, ready to be fingerprinted and dispatched.
#[derive(Debug, Clone)]
pub struct Payload {
    /// `sha256(JCS({"tool":…,"args":…}))` over the effect-bearing args.
    pub fingerprint: String,
    /// The args as given (the key argument still as the caller set it).
    args: Value,
    /// Name of the key argument to overwrite at dispatch, if any.
    key_argument: Option<String>,
    /// Spend in minor units, when the tool has a quota.
    pub spend: Option<u128>,
    /// Why a person must approve the call before it is sent (the tool's
    /// `approval` rule), if one must.
    pub approval: Option<String>,
}

/// A call that cannot be protected as given.
pub type Refusal = (BlockReason, String);

impl Payload {
    /// Parse `args` (a JSON object) under `policy`.
    pub fn build(tool: &str, args: &str, policy: &Policy, settings: &Settings) -> Result<Result<Self, Refusal>, Error> {
        let args = canon::parse_exact(args.as_bytes(), &limits(settings)).map_err(json_error)?;
        if !matches!(args, Value::Object(_)) {
            return Err(Error::InvalidRequest("args must be a JSON object".to_string()));
        }
        let key_argument = match &policy.key_argument {
            Some(name) => Some(name.clone()),
            None => key_argument_names(policy)
                .find(|n| args.get(n).is_some())
                .map(str::to_string),
        };
        let effect = match &policy.effect_fields {
            None => {
                let mut effect = args.clone();
                if let Some(name) = &key_argument {
                    effect.remove(name);
                }
                effect
            }
            Some(fields) => {
                let mut members: Vec<(String, Value)> = Vec::with_capacity(fields.len());
                for field in fields {
                    match args.pointer(field) {
                        Some(v) => members.push((field.clone(), v.clone())),
                        None => {
                            return Ok(Err((
                                BlockReason::PayloadRequired,
                                format!("effect field {field} is missing from the args of {tool}"),
                            )));
                        }
                    }
                }
                Value::Object(members)
            }
        };
        let spend = match &policy.quota {
            None => None,
            Some(quota) => match args.pointer(&quota.spend_field) {
                None => {
                    return Ok(Err((
                        BlockReason::PayloadRequired,
                        format!("spend field {} is missing from the args of {tool}", quota.spend_field),
                    )));
                }
                Some(value) => Some(spend_of(value, &quota.spend_field, quota.decimals)?),
            },
        };
        let approval = approval_needed(&policy.approval, &args);
        let fingerprint = fingerprint_of(tool, effect);
        Ok(Ok(Payload {
            fingerprint,
            args,
            key_argument,
            spend,
            approval,
        }))
    }

    /// Whether the dispatched args carry the provider key (a key argument).
    pub fn carries_key(&self) -> bool {
        self.key_argument.is_some()
    }

    /// The canonical args to dispatch, the key argument (if any) set to `provider_key`.
    pub fn dispatch_args(&self, provider_key: &str) -> String {
        let mut args = self.args.clone();
        if let Some(name) = &self.key_argument {
            args.insert(name.clone(), Value::String(provider_key.to_string()));
        }
        let mut out = String::new();
        canon::write_canonical(&args, &mut out);
        out
    }
}

/// `sha256(JCS({"tool": tool, "args": args}))`.
pub fn fingerprint_of(tool: &str, args: Value) -> String {
    let members = alloc::vec![
        ("tool".to_string(), Value::String(tool.to_string())),
        ("args".to_string(), args)
    ];
    sha256_jcs(&Value::Object(members))
}

/// [`fingerprint_of`] the parse of `args`, straight from the text: the
/// canonical args are written while parsing (no tree, no buffer per value)
/// inside `{"args":…,"tool":…}`, whose members are already in canonical
/// order ("args" sorts before "tool"). Same bytes hashed, same errors as
/// [`canon::parse_exact`] then [`fingerprint_of`].
pub fn fingerprint_of_text(tool: &str, args: &[u8], limits: &canon::Limits) -> Result<String, canon::Error> {
    let mut text = String::with_capacity(args.len() + tool.len() + 20);
    text.push_str("{\"args\":");
    canon::canonicalize_exact_into(args, limits, &mut text)?;
    text.push_str(",\"tool\":");
    canon::write_canonical(&Value::String(tool.to_string()), &mut text);
    text.push('}');
    Ok(crate::digest::sha256_hex(text.as_bytes()))
}

/// Why `rule` needs a person to approve a call with `args`, if it does. An
/// amount the rule cannot read (missing, not a number, too precise or too
/// large to compare) needs one: the rule fails closed.
fn approval_needed(rule: &ApprovalRule, args: &Value) -> Option<String> {
    let (field, above) = match rule {
        ApprovalRule::Never => return None,
        ApprovalRule::Always => return Some("the tool needs a person's approval for every call".to_string()),
        ApprovalRule::Above { field, above } => (field, above),
    };
    let text = match args.pointer(field) {
        None => {
            return Some(format!(
                "{field} is missing, so it cannot be shown to be at most {above}"
            ));
        }
        Some(Value::Number(n)) => n.raw.as_str(),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Some(format!(
                "{field} is not a number, so it cannot be shown to be at most {above}"
            ));
        }
    };
    match (parse_decimal(text), parse_decimal(above)) {
        (Ok(amount), Ok(threshold)) if amount <= threshold => None,
        (Ok(_), Ok(_)) => Some(format!("{field} is {text}, above {above}")),
        (Err(e), _) | (_, Err(e)) => Some(format!("{field}: {e}, so it cannot be shown to be at most {above}")),
    }
}

fn spend_of(value: &Value, field: &str, decimals: u8) -> Result<u128, Error> {
    let text = match value {
        Value::Number(n) => n.raw.as_str(),
        Value::String(s) => s.as_str(),
        _ => return Err(Error::InvalidRequest(format!("spend field {field} is not a number"))),
    };
    parse_minor_units(text, decimals).map_err(|e| Error::InvalidRequest(format!("spend field {field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass fingerprint hashes the same bytes as the tree path, and fails the same way.
    #[test]
    fn fingerprint_of_text_matches_the_tree_path() {
        let limits = canon::Limits::default();
        for args in [
            r#"{"b":1,"a":[true,null,"x\u00e9\"y"],"c":{"z":1.50,"y":1e3}}"#,
            r#"[]"#,
            r#""tool""#,
            r#"{"order":1234,"amount":200.5,"items":[{"sku":"A","qty":2}],"note":"caf\u00e9"}"#,
            "{\"\u{1f600}\":1,\"\u{ffff}\":2}",
        ] {
            for tool in ["refund", "t\"\u{7}é"] {
                let tree = fingerprint_of(tool, canon::parse_exact(args.as_bytes(), &limits).unwrap());
                assert_eq!(fingerprint_of_text(tool, args.as_bytes(), &limits), Ok(tree), "{args}");
            }
        }
        for bad in [r#"{"a":1,"a":2}"#, "[1,", "\"\u{1}\"", "01", "[9007199254740993]"] {
            assert_eq!(
                fingerprint_of_text("t", bad.as_bytes(), &limits).unwrap_err(),
                canon::parse_exact(bad.as_bytes(), &limits).unwrap_err(),
                "{bad}"
            );
        }
    }
}
