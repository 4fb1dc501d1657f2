//! Thousands of trials per demo run: starting and stopping must be cheap and leave nothing behind.
//!
//! One test in its own binary, so no other test's sockets or threads blur the counts.

mod common;

use std::time::{Duration, Instant};

use common::{TIMEOUT, Trial};
use refund::{CallError, Fault, Mode, ORDER_ID};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

#[test]
fn two_hundred_trials_leave_nothing_behind() {
    // Warm up once so lazily created process-wide state is not counted as a leak.
    drop(Trial::new(Mode::Idempotent, Fault::None));
    let (fds, tasks) = (open_fds(), threads());
    let started = Instant::now();
    let (mut setup, mut calls, mut teardown) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for i in 0..200 {
        let mode = Mode::ALL[i % 2];
        let fault = Fault::ALL[i % Fault::ALL.len()];
        let t0 = Instant::now();
        let t = Trial::new(mode, fault);
        let t1 = Instant::now();
        // A late reply must not slow the loop: the client gives up early and the drop cuts the delay short.
        let client = t.client(Duration::from_millis(if fault == Fault::LateReply { 50 } else { 1000 }));
        let mut call = Some(std::thread::spawn(move || client.refund_order(ORDER_ID, 200.0, "k")));
        if fault == Fault::CrashAfterDispatch {
            // Held until the trial is dropped, as when the harness kills the agent.
            assert!(t.proxy.wait_dispatched(TIMEOUT));
        } else {
            match call.take().unwrap().join().unwrap() {
                Ok(_) | Err(CallError::Ambiguous(_)) => {}
                Err(e) => panic!("{fault}: {e:?}"),
            }
            let lookup = t.client(TIMEOUT).find_refund_by_key("k").unwrap();
            assert_eq!(
                lookup.found,
                t.count() == 1 && fault != Fault::StaleRead,
                "{fault} {mode}"
            );
        }
        let t2 = Instant::now();
        drop(t);
        let t3 = Instant::now();
        if let Some(held) = call {
            assert!(matches!(held.join().unwrap(), Err(CallError::Ambiguous(_))));
        }
        (setup, calls, teardown) = (setup + (t1 - t0), calls + (t2 - t1), teardown + (t3 - t2));
    }
    let total = started.elapsed();
    eprintln!(
        "200 trials in {total:?}; per trial: start {:?}, calls {:?}, stop {:?}; fds {fds}->{}, threads {tasks}->{}",
        setup / 200,
        calls / 200,
        teardown / 200,
        open_fds(),
        threads()
    );
    assert!(open_fds() <= fds + 2, "fds leaked: {fds} -> {}", open_fds());
    assert!(threads() <= tasks, "threads leaked: {tasks} -> {}", threads());
    assert!(total < Duration::from_secs(60), "too slow: {total:?}");
}
