//! The README's Rust quick start (host/once/tests/readme.rs keeps the two identical and runs it twice).

use std::cell::Cell;

use once::{Once, Sent};

fn main() -> Result<(), once::OnceError> {
    let once = Once::sqlite("once.db")?.build()?; // a durable ledger file (or Once::open("postgres://…"))
    let sent = Cell::new(0);
    let refund_order = |order_id: u64, amount: u64| {
        let args = format!(r#"{{"order_id":{order_id},"amount":{amount}}}"#);
        // The key is minted by the application before the first attempt, the same on every retry.
        let key = format!("refund-{order_id}");
        once.call("tenant-7", Some(&key), "refund_order", &args, |_grant| {
            sent.set(sent.get() + 1); // call your provider's API here
            Sent::Success(format!(r#"{{"refund_id":"r-{order_id}","amount":{amount}}}"#))
        })
    };
    println!("{}", refund_order(1234, 200)?.receipt().unwrap_or_default()); // sent once
    println!("{}", refund_order(1234, 200)?.receipt().unwrap_or_default()); // the retry replays the stored receipt
    println!("sent {} time(s) by this run", sent.get()); // 1 (and 0 when you run it again)
    Ok(())
}
