//! Operation keys: which carrier supplied one, derived keys, provider keys, fences.

use alloc::format;
use alloc::string::String;

use crate::digest::{Part, hmac_sha256_jcs_array, sha256_jcs_array};
use crate::input::check_new_name;
use crate::secret::KeySecret;
use crate::types::{BlockReason, Error, Settings};

/// The application's key, if its carriers supplied one, or why they cannot be trusted.
pub fn resolve_carriers(
    carriers: &[(String, String)],
    settings: &Settings,
) -> Result<Result<Option<String>, (BlockReason, String)>, Error> {
    let mut chosen: Option<&(String, String)> = None;
    for carrier in carriers {
        check_new_name(&format!("operation key from {}", carrier.0), &carrier.1, settings)?;
        match chosen {
            None => chosen = Some(carrier),
            Some(first) if first.1 != carrier.1 => {
                return Ok(Err((
                    BlockReason::IdentityConflict,
                    format!(
                        "key carriers disagree: {} says {:?}, {} says {:?}",
                        first.0, first.1, carrier.0, carrier.1
                    ),
                )));
            }
            Some(_) => {}
        }
    }
    Ok(Ok(chosen.map(|c| c.1.clone())))
}

/// The key derived from a call's fingerprint (argument-hash dedupe).
pub fn derived_key(fingerprint: &str) -> String {
    format!("derived:{fingerprint}")
}

/// What travels to the provider: an HMAC-SHA-256 of (scope, key), keyed by
/// the ledger's secret ([`crate::secret`]), so two scopes that use the same
/// key never share a provider-side dedupe slot, and nobody who cannot read
/// the ledger — another tenant of the same gateway above all — can compute
/// a scope's key and read its effect through a lookup tool.
///
/// `first_version` is the record version the operation started at: 1 for
/// the first operation a key names. A key that names a new operation later
/// (a derived key past its window, a key whose tombstone expired) starts
/// after its earlier audit trail, and gets a provider key of its own, so the
/// provider's dedupe never answers the new operation with the old effect.
///
/// Derived once, when the record is created, and stored in it: every later
/// dispatch and read uses the stored key, so a rotated secret never changes
/// the key of an operation already begun.
pub fn provider_key(secret: &KeySecret, scope: &str, key: &str, first_version: u64) -> String {
    let scope = if crate::mutant::on(crate::mutant::Mutant::ReadAcrossScopes) {
        ""
    } else {
        scope
    };
    let parts = [
        Part::Str("once-provider-key"),
        Part::Str(scope),
        Part::Str(key),
        Part::Int(first_version),
    ];
    let parts = if first_version > 1 { &parts[..] } else { &parts[..3] };
    format!("once-{}", hmac_sha256_jcs_array(&secret.key, parts))
}

/// How provider keys were derived before the ledger kept a secret: an
/// unsalted SHA-256 of the same array, which anyone knowing (scope, key) can
/// compute. Never used for a new record; records made with it (no
/// `key_secret`) keep their stored key, and this says what that key is.
pub fn legacy_provider_key(scope: &str, key: &str, first_version: u64) -> String {
    let parts = [
        Part::Str("once-provider-key"),
        Part::Str(scope),
        Part::Str(key),
        Part::Int(first_version),
    ];
    let parts = if first_version > 1 { &parts[..] } else { &parts[..3] };
    format!("once-{}", sha256_jcs_array(parts))
}

/// A fence unique per (scope, key, attempt), and across a lost-and-recreated ledger.
pub fn fence(scope: &str, key: &str, attempt: u32, created_at: u64, granted_at: u64) -> String {
    let mut digest = sha256_jcs_array(&[
        Part::Str("once-fence"),
        Part::Str(scope),
        Part::Str(key),
        Part::Int(u64::from(attempt)),
        Part::Int(created_at),
        Part::Int(granted_at),
    ]);
    digest.truncate(32);
    format!("{attempt}-{digest}")
}

/// The stable id of an escalation: (scope, key, deadline).
pub fn escalation_id(scope: &str, key: &str, deadline: u64, reason: &str) -> String {
    sha256_jcs_array(&[
        Part::Str("once-escalation"),
        Part::Str(scope),
        Part::Str(key),
        Part::Int(deadline),
        Part::Str(reason),
    ])
}
