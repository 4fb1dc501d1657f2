//! The call protocol driven by hand with the WIT's generated types (docs/contract.md): once-host supplies the
//! I/O (an in-memory ledger, the system clock); this loop does what each step says and decides nothing.

use once::io::{Clock, HostState, SystemClock};
use once::storage::{Storage, memory::MemoryStorage};
use once::types::{Call, Configuration, LedgerEncoding::Typed, Outcome::*, ProviderReads::Import, Step};
use std::{sync::Arc, time::Duration};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (ledger, clock, mut sent) = (Arc::new(MemoryStorage::new()), Arc::new(SystemClock::default()), 0);
    let mut guest = once::runtime::Runtime::shared()?.instantiate(HostState::new(ledger.clone(), clock.clone()))?;
    let (settings, defaults) = (guest.default_settings()?, once::policy_input()); // every tool: the defaults
    let configuration = Configuration { settings, defaults, tools: vec![], ledger_encoding: Typed, reads: Import };
    ledger.claim_body_format(guest.configure(&configuration, 1)??.body_format)?; // before any row is read
    let keys = vec![("api".into(), "refund-1234".into())]; // minted before the first attempt, kept by every retry
    let (scope, tool, args) = ("tenant-7".into(), "refund_order".into(), r#"{"order_id":1234,"amount":200}"#.into());
    let call = Call { scope, keys, tool, args, supersedes: None, acknowledge_confirmed: false };
    for attempt in ["first call", "retry"] {
        let mut step = guest.start(&call)??;
        let account = loop {
            // Send exactly g.args with g.provider_key, never at or after send-by, and wait timeout-ms at most.
            step = match step {
                Step::Dispatch(g) if clock.now() < g.send_by => {
                    sent += 1; // your provider's API here, and what it answered:
                    guest.report(&g.scope, &g.key, &g.fence, &Success(r#"{"refund_id":"r-1"}"#.into()))??
                }
                Step::Dispatch(g) => guest.report(&g.scope, &g.key, &g.fence, &NotSent)??, // too late to start
                Step::Wait(w) => {
                    std::thread::sleep(Duration::from_millis(w.next.saturating_sub(clock.now())));
                    guest.resume(&w.scope, &w.key)??
                }
                Step::Done(account) => break account,
                other => return Err(format!("not configured for {other:?}").into()), // read (reads: steps), direct
            };
        };
        println!("{attempt}: {}, effect {}, again {}", account.ending.name(), account.effect, account.repeat);
    }
    println!("sent {sent} time(s)");
    Ok(())
}
