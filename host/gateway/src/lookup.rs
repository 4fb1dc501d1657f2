//! A PROTECT tool's lookup: the `lookup = { … }` table of `once.toml`, its
//! argument templates (`{key}` is the provider key, `{args/POINTER}` an
//! argument of the call) and how its answer becomes evidence.

use std::time::Duration;

use once::types::Evidence;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::Millis;

/// A `lookup = { … }` table, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupSection {
    pub(crate) tool: String,
    #[serde(default)]
    args: Option<toml::Table>,
    found: String,
    receipt: Option<String>,
    read_position: String,
    timeout: Option<Millis>,
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

/// Whether the lookup's arguments use `{key}` (so the provider key must travel to the upstream).
pub(crate) fn reads_key(section: &LookupSection) -> bool {
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
    /// A lookup table, checked: its templates, pointers and read position.
    pub(crate) fn from_section(s: &LookupSection) -> Result<Lookup, String> {
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
            timeout: Duration::from_millis(s.timeout.map_or(5_000, |m| m.0)),
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
    fn pointers() {
        assert!(check_pointer("").is_ok());
        assert!(check_pointer("/a/~0/~1").is_ok());
        assert!(check_pointer("found").is_err());
        assert!(check_pointer("/a~").is_err());
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
}
