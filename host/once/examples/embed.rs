//! The README's embedding example (a test keeps the two identical).

use once::types::Evidence;
use once::{Called, Once, Sent};

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
    match called {
        Called::Confirmed { receipt, replayed, .. } => println!("done (replayed: {replayed}): {receipt}"),
        Called::Unknown(u) => println!("{} may have happened; nothing is re-sent until reconciled", u.key),
        other => println!("{other:?}"),
    }
    Ok(())
}

fn lookup_refund(_provider_key: &str) -> Evidence {
    Evidence::Unknown("ask your provider's API here".into())
}

fn send_refund(_args: &str, _provider_key: &str) -> Sent {
    Sent::NotSent // call your provider's API here
}
