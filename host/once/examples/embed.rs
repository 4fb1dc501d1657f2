//! The guide's Rust embedding example (docs/rust.md; tests/docs/check.py keeps the page and this file identical).

use once::types::{Effect, Evidence};
use once::{Once, Sent};

fn main() -> Result<(), once::OnceError> {
    let once = Once::sqlite("once.db")?
        // The authoritative read that reconciliation uses (never the write path).
        .provider(|_tool: &str, provider_key: &str, _args: &str| lookup_refund(provider_key))
        .build()?;
    // Mint the key before the first attempt; reuse it on every retry.
    let args = r#"{"order_id":1234,"amount":200}"#;
    let called = once.call("tenant-7", Some("refund-order-1234"), "refund_order", args, |d| {
        send_refund(d.args, d.provider_key) // Sent::Success / Rejected / Ambiguous / NotSent
    })?;
    // The engine's account: did it happen, and what would the same call again do.
    match called.effect() {
        Effect::Happened => println!("refunded: {}", called.receipt().unwrap_or_default()),
        Effect::Unknown => println!("may have happened: nothing is re-sent until reconciled"),
        Effect::None => println!("not refunded: {called:?}"),
    }
    Ok(())
}

fn lookup_refund(_provider_key: &str) -> Evidence {
    Evidence::Unknown("ask your provider's API here".into())
}

fn send_refund(_args: &str, _provider_key: &str) -> Sent {
    Sent::NotSent // call your provider's API here
}
