//! The operations of the `machine` target, decoded from the fuzzer's bytes;
//! the host, model and invariants are `guest/tests/model/machine.rs`.

use arbitrary::Unstructured;

pub use crate::model::machine::{DAY, Ev, FenceChoice, KEYS, Knobs, Op, Out, SECOND, run};

fn ev(u: &mut Unstructured<'_>) -> arbitrary::Result<Ev> {
    Ok(match u.int_in_range(0..=7u8)? {
        0..=1 => Ev::Confirmed(u.int_in_range(0..=2)?),
        2..=5 => Ev::Absent(*u.choose(&[0i64, -1, -1_000, -60_000, -120_000, 5_000])?),
        _ => Ev::Unknown,
    })
}

fn op(u: &mut Unstructured<'_>) -> arbitrary::Result<Op> {
    let key = |u: &mut Unstructured<'_>| u.int_in_range(0..=KEYS.len() - 1);
    Ok(match u.int_in_range(0..=20u8)? {
        0..=4 => Op::Begin(key(u)?, ev(u)?),
        5..=9 => {
            let fence = match u.int_in_range(0..=9u8)? {
                0..=5 => FenceChoice::Current,
                6..=8 => FenceChoice::Stale(u.int_in_range(0..=7)?),
                _ => FenceChoice::Bogus,
            };
            let out = match u.int_in_range(0..=8u8)? {
                0..=2 => Out::Success(u.int_in_range(0..=2)?),
                3..=4 => Out::Rejected,
                5..=7 => Out::Ambiguous,
                _ => Out::NotSent,
            };
            Op::Finish(key(u)?, fence, out)
        }
        10..=12 => Op::Reconcile(key(u)?, ev(u)?),
        13..=14 => Op::Sweep(ev(u)?),
        15 => Op::Prune,
        16..=19 => Op::Advance(match u.int_in_range(0..=13u8)? {
            0..=3 => u.int_in_range(0..=1_999)?,
            4..=6 => u.int_in_range(34_000..=36_999)?,
            7..=9 => u.int_in_range(59_000..=62_999)?,
            10 => 15 * 60 * SECOND,
            11 => DAY,
            _ => 7 * DAY + 1,
        }),
        _ => Op::FailNextCommit {
            applied: u.arbitrary()?,
        },
    })
}

/// Decode the knobs and up to 60 operations from the fuzzer's bytes.
pub fn decode(u: &mut Unstructured<'_>) -> arbitrary::Result<(Knobs, Vec<Op>)> {
    let knobs = Knobs {
        provider_claims_key: u.arbitrary()?,
        verify_first: u.int_in_range(0..=3u8)? == 0,
        attempt_budget: u.int_in_range(1..=4)?,
    };
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 60 {
        ops.push(op(u)?);
    }
    Ok((knobs, ops))
}
