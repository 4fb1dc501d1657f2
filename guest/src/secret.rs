//! The ledger's provider-key secret: the key of the HMAC that provider keys
//! are derived with (DESIGN.md "Provider keys are not guessable").
//!
//! An unsalted hash of (scope, key) let one tenant of a shared gateway
//! compute another's provider key and read the other's effect through a
//! DIRECT lookup tool. The secret makes the derivation unguessable to anyone
//! who cannot read the ledger itself.
//!
//! **Where it lives.** In the ledger, as one reserved row that no scan,
//! export or operator command reaches: table `quota`, scope `""` (no
//! application scope is empty, so it collides with no bucket), key
//! [`SECRET_KEY`], no `due-at` (so prune and sweep never see it). It goes
//! through the same ledger `get` / `commit` every store already
//! implements, so every host and store sharing a ledger derives the same
//! keys with no host code beyond the `entropy` import. Whichever host needs
//! it first creates it with a compare-and-swap (insert-if-absent) from 32
//! bytes of the host's `entropy`; a host that loses that race reads the
//! winner's. A component instance then keeps it in memory
//! ([`SecretCache`]).
//!
//! **It never leaves the guest.** No answer, account, escalation, record
//! body or audit event carries it: records name the secret they were keyed
//! with by its [`KeySecret::id`], a hash of it.
//!
//! **Each record keeps the key it was dispatched with.** A record stores its
//! provider key and is never re-derived (reconciliation reads the provider
//! by the stored key; a changed key would be a duplicate effect). Records
//! written before the secret existed have no `key_secret` and keep their
//! unsalted key ([`crate::identity::legacy_provider_key`]) forever. A
//! rotation — replacing this row's secret — therefore changes the keys of
//! operations that begin afterwards only; see docs/design.md "Provider keys".

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;
use serde::{Deserialize, Serialize};

use crate::digest::{Part, hex, sha256_jcs_array};
use crate::host::{CommitError, Host};
use crate::store::LedgerError;
use crate::types::{Batch, Put, Row, Table};

/// The reserved row's table.
pub const SECRET_TABLE: Table = Table::Quota;
/// The reserved row's scope: empty, which no application scope can be.
pub const SECRET_SCOPE: &str = "";
/// The reserved row's key.
pub const SECRET_KEY: &str = "once:provider-key-secret";
/// Bytes of secret asked of the host's `entropy`: the HMAC-SHA-256 block's worth of security.
pub const SECRET_BYTES: usize = 32;

/// The secret provider keys are derived with, as the guest holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret {
    /// Names the secret in records (`key_secret`) without revealing it: the
    /// first 16 hex digits of a SHA-256 over it.
    pub id: String,
    /// The HMAC key.
    pub key: Vec<u8>,
}

// Never print the key: a Debug of a record, a decision or an error must not carry it.
impl core::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeySecret")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl KeySecret {
    /// The secret made of these bytes.
    pub fn from_bytes(key: Vec<u8>) -> KeySecret {
        let key_hex = hex(&key);
        let mut id = sha256_jcs_array(&[Part::Str("once-provider-key-secret-id"), Part::Str(&key_hex)]);
        id.truncate(16);
        KeySecret { id, key }
    }
}

/// The reserved row's body.
#[derive(Serialize, Deserialize)]
struct SecretBody {
    /// [`KeySecret::id`], so a reader can check it read the secret whole.
    id: String,
    /// The secret, lower-case hex.
    secret: String,
}

/// Where a component instance keeps the secret once read: it never changes
/// under a running instance's feet in a way that matters (every record
/// keeps the key it was made with), so one read per instance is enough.
#[derive(Debug, Default)]
pub struct SecretCache(RefCell<Option<KeySecret>>);

impl SecretCache {
    /// An empty cache.
    pub const fn new() -> Self {
        SecretCache(RefCell::new(None))
    }
}

/// The ledger's secret: from the host's cache, else read from the ledger,
/// else created there (a compare-and-swap; the loser of a race reads the
/// winner's). A store failure, an unreadable row or a host without entropy
/// is an error: a provider key is never derived without the secret.
pub fn key_secret(h: &impl Host) -> Result<KeySecret, LedgerError> {
    if let Some(secret) = h.secret_cache().and_then(|c| c.0.borrow().clone()) {
        return Ok(secret);
    }
    let secret = match read(h)? {
        Some(secret) => secret,
        None => match create(h) {
            Ok(secret) => secret,
            // Another host created it first: theirs is the ledger's.
            Err(LedgerError::Conflict) => read(h)?.ok_or_else(|| {
                LedgerError::Storage("the ledger's provider-key secret vanished after a conflicting create".into())
            })?,
            Err(e) => return Err(e),
        },
    };
    if let Some(cache) = h.secret_cache() {
        *cache.0.borrow_mut() = Some(secret.clone());
    }
    Ok(secret)
}

fn read(h: &impl Host) -> Result<Option<KeySecret>, LedgerError> {
    let Some(stored) = h
        .get(SECRET_TABLE, SECRET_SCOPE, SECRET_KEY)
        .map_err(LedgerError::Storage)?
    else {
        return Ok(None);
    };
    parse(&stored.body).map(Some)
}

/// The secret in a reserved row's body; the error never quotes the body.
fn parse(body: &str) -> Result<KeySecret, LedgerError> {
    let unreadable = |why: &str| LedgerError::Storage(format!("the ledger's provider-key secret is unreadable: {why}"));
    let body: SecretBody = serde_json::from_str(body).map_err(|_| unreadable("not its JSON form"))?;
    let key = unhex(&body.secret).ok_or_else(|| unreadable("not hex"))?;
    if key.len() != SECRET_BYTES {
        return Err(unreadable("not 32 bytes"));
    }
    let secret = KeySecret::from_bytes(key);
    if secret.id != body.id {
        return Err(unreadable("its id does not match it"));
    }
    Ok(secret)
}

fn create(h: &impl Host) -> Result<KeySecret, LedgerError> {
    let bytes = h.entropy(SECRET_BYTES as u32);
    if bytes.len() != SECRET_BYTES {
        return Err(LedgerError::Storage(format!(
            "the host supplied {} of the {SECRET_BYTES} random bytes the ledger's provider-key secret needs",
            bytes.len()
        )));
    }
    let secret = KeySecret::from_bytes(bytes);
    let batch = creation(&secret);
    h.commit(&batch).map_err(|e| match e {
        CommitError::Conflict => LedgerError::Conflict,
        CommitError::Storage(s) => LedgerError::Storage(s),
    })?;
    Ok(secret)
}

/// The batch that stores `secret` as the ledger's, if the ledger has none:
/// an insert of the reserved row, nothing else (no audit event: it is no
/// operation's transition). Public so a model or a test can start from a
/// ledger that already has its secret.
pub fn creation(secret: &KeySecret) -> Batch {
    let body = serde_json::to_string(&SecretBody {
        id: secret.id.clone(),
        secret: hex(&secret.key),
    })
    .expect("two strings always serialize");
    Batch {
        puts: vec![Put {
            table: SECRET_TABLE,
            scope: SECRET_SCOPE.to_string(),
            key: SECRET_KEY.to_string(),
            expected: None,
            row: Some(Row {
                table: SECRET_TABLE,
                scope: SECRET_SCOPE.to_string(),
                key: SECRET_KEY.to_string(),
                version: 1,
                state: None,
                // No due-at: no scan (sweep, prune) ever returns the row.
                due_at: None,
                owner: None,
                body,
            }),
        }],
        events: Vec::new(),
        deferrable: false,
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryHost;

    #[test]
    fn created_once_then_read_back_and_never_printed() {
        let h = MemoryHost::without_secret();
        let first = key_secret(&h).unwrap();
        assert_eq!(first.key.len(), SECRET_BYTES);
        assert_eq!(key_secret(&h).unwrap(), first, "read back, not created again");
        let row = h.get(SECRET_TABLE, SECRET_SCOPE, SECRET_KEY).unwrap().unwrap();
        assert_eq!(row.version, 1);
        assert!(!format!("{first:?}").contains(&hex(&first.key)), "Debug hides the key");
    }

    #[test]
    fn a_host_without_entropy_or_a_damaged_row_is_an_error_never_a_weaker_key() {
        let h = MemoryHost::without_secret();
        h.set_entropy(Vec::new());
        assert!(matches!(key_secret(&h), Err(LedgerError::Storage(m)) if m.contains("0 of the 32")));
        let h = MemoryHost::without_secret();
        let secret = key_secret(&h).unwrap();
        let damaged = format!(r#"{{"id":"{}","secret":"{}"}}"#, secret.id, "00".repeat(SECRET_BYTES));
        assert!(
            parse(&damaged).is_err(),
            "an id that does not match its secret is refused"
        );
        assert!(parse("{}").is_err());
    }

    #[test]
    fn unhex_reads_what_hex_writes() {
        assert_eq!(unhex(&hex(&[0, 1, 0xab, 0xff])), Some(vec![0, 1, 0xab, 0xff]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }
}
