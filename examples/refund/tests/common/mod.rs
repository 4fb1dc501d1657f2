//! A trial as the demo runs one: fresh ledger, service, proxy and client.

#![allow(dead_code)]

use std::time::Duration;

use refund::{Client, EffectLedger, Fault, FaultProxy, Mode, ORDER_ID, ProxyOptions, Refund, Service};
use tempfile::TempDir;

/// Field order matters: the proxy and service stop before the directory holding the ledger goes.
pub struct Trial {
    pub proxy: FaultProxy,
    pub service: Service,
    pub dir: TempDir,
}

impl Trial {
    pub fn new(mode: Mode, fault: Fault) -> Trial {
        Trial::with_options(mode, fault, ProxyOptions::default())
    }

    pub fn with_options(mode: Mode, fault: Fault, options: ProxyOptions) -> Trial {
        let dir = tempfile::tempdir().unwrap();
        let service = Service::start(dir.path().join("ledger.db"), mode).unwrap();
        let proxy = FaultProxy::start(service.addr(), fault, options).unwrap();
        Trial { proxy, service, dir }
    }

    /// A client through the proxy.
    pub fn client(&self, timeout: Duration) -> Client {
        Client::new(self.proxy.base_url(), timeout)
    }

    /// A client straight to the service, bypassing faults.
    pub fn direct(&self) -> Client {
        Client::new(self.service.base_url(), Duration::from_secs(5))
    }

    pub fn ledger(&self) -> EffectLedger {
        EffectLedger::open(self.service.db_path()).unwrap()
    }

    pub fn refunds(&self) -> Vec<Refund> {
        self.ledger().refunds(ORDER_ID).unwrap()
    }

    pub fn count(&self) -> u64 {
        self.ledger().count(ORDER_ID).unwrap()
    }
}

pub const TIMEOUT: Duration = Duration::from_secs(2);
