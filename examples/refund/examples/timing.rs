//! Prints what a trial costs: service and proxy start/stop, and per-request latency direct and through the proxy.
//!
//! `cargo run --release -p once-refund-example --example timing [LEDGER_DIR]`

use std::time::{Duration, Instant};

use refund::{Client, Fault, FaultProxy, Mode, ORDER_ID, ProxyOptions, Service};

fn per(total: Duration, n: u32) -> String {
    format!("{:>8.1} µs", total.as_secs_f64() * 1e6 / f64::from(n))
}

fn main() {
    let dir = std::env::args().nth(1).map_or_else(std::env::temp_dir, Into::into);
    let n = 200;
    let (mut svc_start, mut proxy_start, mut proxy_stop, mut svc_stop) = Default::default();
    let (mut get_direct, mut get_proxy, mut post_proxy, mut lookup_proxy) = Default::default();
    for i in 0..n {
        let tmp = tempfile::tempdir_in(&dir).unwrap();
        let t = Instant::now();
        let service = Service::start(tmp.path().join("ledger.db"), Mode::ALL[i as usize % 2]).unwrap();
        svc_start += t.elapsed();
        let t = Instant::now();
        let proxy = FaultProxy::start(service.addr(), Fault::None, ProxyOptions::default()).unwrap();
        proxy_start += t.elapsed();
        let direct = Client::new(service.base_url(), Duration::from_secs(2));
        let via = Client::new(proxy.base_url(), Duration::from_secs(2));
        let t = Instant::now();
        direct.get_order(ORDER_ID).unwrap();
        get_direct += t.elapsed();
        let t = Instant::now();
        via.get_order(ORDER_ID).unwrap();
        get_proxy += t.elapsed();
        let t = Instant::now();
        via.refund_order(ORDER_ID, 200.0, "k").unwrap();
        post_proxy += t.elapsed();
        let t = Instant::now();
        via.find_refund_by_key("k").unwrap();
        lookup_proxy += t.elapsed();
        let t = Instant::now();
        drop(proxy);
        proxy_stop += t.elapsed();
        let t = Instant::now();
        drop(service);
        svc_stop += t.elapsed();
    }
    println!("ledger dir: {}", dir.display());
    println!("service start (fresh ledger) {}", per(svc_start, n));
    println!("proxy start                  {}", per(proxy_start, n));
    println!("GET /orders direct           {}", per(get_direct, n));
    println!("GET /orders via proxy        {}", per(get_proxy, n));
    println!("POST /refunds via proxy      {}", per(post_proxy, n));
    println!("GET /refunds?key via proxy   {}", per(lookup_proxy, n));
    println!("proxy stop                   {}", per(proxy_stop, n));
    println!("service stop                 {}", per(svc_stop, n));

    // Warm: one long-lived pair, as a demo agent's second and later calls see it.
    let tmp = tempfile::tempdir_in(&dir).unwrap();
    let service = Service::start(tmp.path().join("ledger.db"), Mode::Idempotent).unwrap();
    let proxy = FaultProxy::start(service.addr(), Fault::None, ProxyOptions::default()).unwrap();
    let direct = Client::new(service.base_url(), Duration::from_secs(2));
    let via = Client::new(proxy.base_url(), Duration::from_secs(2));
    let m = 1000;
    for (name, client) in [("direct", &direct), ("via proxy", &via)] {
        let t = Instant::now();
        for _ in 0..m {
            client.get_order(ORDER_ID).unwrap();
        }
        println!("warm GET /orders {name:<10}  {}", per(t.elapsed(), m));
        let t = Instant::now();
        for i in 0..m {
            client.refund_order(ORDER_ID, 0.01, &format!("{name}-{i}")).unwrap();
        }
        println!("warm POST /refunds {name:<10}{}", per(t.elapsed(), m));
    }
}
