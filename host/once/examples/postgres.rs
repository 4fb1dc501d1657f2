//! docs/deployment.md's example: a PostgreSQL ledger (once-host's `postgres` feature), with the provider's read.

use once::Once;
use once::types::Evidence;

fn main() -> Result<(), once::OnceError> {
    let once = Once::open("postgres://once@db.internal:5432/prod?schema=payments")?
        .provider(|_tool: &str, provider_key: &str, _args: &str| lookup(provider_key))
        .build()?;
    println!("{:?}", once.stats(None)?);
    Ok(())
}

/// The provider's authoritative read of an effect by its provider key.
fn lookup(_provider_key: &str) -> Evidence {
    Evidence::Unknown("ask your provider's API here".into())
}
