//! The operators file: who may use the page, by token hash, and which scopes each sees.
//!
//! ```toml
//! [[operator]]
//! name = "alice"                 # recorded with every resolution she makes
//! token_sha256 = "9f86d0…"       # printf %s "$TOKEN" | sha256sum
//! scopes = ["tenant-a"]          # omit: every scope
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::access::Operator;

/// A bad operators file: what is wrong, and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, and where (TOML's own message has the line).
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    operator: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token_sha256: String,
    scopes: Option<Vec<String>>,
}

/// Read an operators file.
pub fn load_operators(path: &Path) -> Result<Vec<Operator>, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: shown.clone(),
        error,
    })?;
    parse_operators(&text).map_err(|message| ConfigError::Invalid { path: shown, message })
}

fn parse_operators(text: &str) -> Result<Vec<Operator>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.operator.is_empty() {
        return Err("no [[operator]]: nobody could open the page".into());
    }
    let mut operators: Vec<Operator> = Vec::new();
    for (i, e) in file.operator.into_iter().enumerate() {
        let at = format!("operator {} ({:?})", i + 1, e.name);
        if e.name.trim().is_empty() {
            return Err(format!("operator {}: name is empty", i + 1));
        }
        let token_sha256 = parse_hash(&e.token_sha256)
            .ok_or_else(|| format!("{at}: token_sha256 must be 64 hex digits (printf %s \"$TOKEN\" | sha256sum)"))?;
        if let Some(scopes) = &e.scopes
            && scopes.is_empty()
        {
            return Err(format!("{at}: scopes = [] would show nothing; omit it for every scope"));
        }
        if operators.iter().any(|o| o.token_sha256 == token_sha256) {
            return Err(format!("{at}: the same token as an earlier operator"));
        }
        if operators.iter().any(|o| o.name == e.name) {
            return Err(format!("{at}: the same name as an earlier operator"));
        }
        operators.push(Operator {
            name: e.name,
            token_sha256,
            scopes: e.scopes,
        });
    }
    Ok(operators)
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{hex, token_sha256};

    #[test]
    fn operators_file_round_trip_and_refusals() {
        let hash = hex(&token_sha256("s3cret"));
        let ok = format!("[[operator]]\nname = \"alice\"\ntoken_sha256 = \"{hash}\"\nscopes = [\"a\"]\n");
        let ops = parse_operators(&ok).unwrap();
        assert_eq!(ops[0].name, "alice");
        assert_eq!(ops[0].token_sha256, token_sha256("s3cret"));
        assert!(ops[0].sees("a") && !ops[0].sees("b"));

        let bad_hash = "[[operator]]\nname = \"bob\"\ntoken_sha256 = \"xyz\"\n";
        assert!(
            parse_operators(bad_hash)
                .unwrap_err()
                .contains("operator 1 (\"bob\"): token_sha256 must be 64 hex")
        );
        let empty = format!("[[operator]]\nname = \"c\"\ntoken_sha256 = \"{hash}\"\nscopes = []\n");
        assert!(parse_operators(&empty).unwrap_err().contains("scopes = []"));
        let twice = format!("{ok}[[operator]]\nname = \"d\"\ntoken_sha256 = \"{hash}\"\n");
        assert!(
            parse_operators(&twice)
                .unwrap_err()
                .contains("operator 2 (\"d\"): the same token")
        );
        let typo = format!("[[operator]]\nname = \"e\"\ntoken = \"{hash}\"\n");
        assert!(parse_operators(&typo).unwrap_err().contains("unknown field `token`"));
        assert!(
            parse_operators("operator = []")
                .unwrap_err()
                .contains("no [[operator]]")
        );
    }
}
