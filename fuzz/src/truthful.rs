//! The operations of the `machine_truthful` target, decoded from the fuzzer's
//! bytes; the truthful provider and its property are `guest/tests/model/truthful.rs`.

use arbitrary::Unstructured;

pub use crate::model::truthful::{Fate, Read, TOp, truthful_run};

use crate::model::machine::SECOND;

fn read(u: &mut Unstructured<'_>) -> arbitrary::Result<Read> {
    Ok(Read {
        lag: *u.choose(&[0u64, 500, 5_000, 60_000])?,
        cannot_tell: u.int_in_range(0..=4u8)? == 0,
    })
}

fn fate(u: &mut Unstructured<'_>) -> arbitrary::Result<Fate> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 => Fate::Commit(0),
        1..=2 => Fate::Commit(u.int_in_range(0..=60_000)?),
        3..=4 => Fate::Commit(u.int_in_range(45_000..=60_000)?),
        _ => Fate::Reject,
    })
}

fn top(u: &mut Unstructured<'_>) -> arbitrary::Result<TOp> {
    // Most steps go to one key, so whole recoveries happen often.
    let key = |u: &mut Unstructured<'_>| -> arbitrary::Result<usize> {
        Ok(match u.int_in_range(0..=5u8)? {
            0..=3 => 0,
            4 => 1,
            _ => 2,
        })
    };
    Ok(match u.int_in_range(0..=27u8)? {
        0..=3 => TOp::Begin(key(u)?, read(u)?),
        4..=5 => TOp::Send(key(u)?, fate(u)?),
        6..=9 => {
            let wait = if u.arbitrary()? { 0 } else { u.int_in_range(0..=39_999)? };
            TOp::Attempt(key(u)?, fate(u)?, wait, u.arbitrary()?)
        }
        10..=13 => {
            let which = if u.int_in_range(0..=9u8)? < 3 {
                Some(u.int_in_range(0..=5)?)
            } else {
                None
            };
            TOp::Report(key(u)?, which, u.arbitrary()?)
        }
        14..=16 => TOp::Reconcile(key(u)?, read(u)?),
        17..=18 => TOp::Sweep(read(u)?),
        19 => TOp::Prune,
        20..=23 => TOp::Advance(match u.int_in_range(0..=10u8)? {
            0..=3 => u.int_in_range(0..=2_999)?,
            4..=6 => u.int_in_range(30_000..=39_999)?,
            7..=9 => u.int_in_range(55_000..=64_999)?,
            _ => 15 * 60 * SECOND,
        }),
        _ => TOp::FailNextCommit {
            applied: u.arbitrary()?,
        },
    })
}

/// Decode verify-first, the attempt budget and up to 80 operations from the fuzzer's bytes.
pub fn decode(u: &mut Unstructured<'_>) -> arbitrary::Result<(bool, u32, Vec<TOp>)> {
    let verify_first = u.int_in_range(0..=3u8)? == 0;
    let budget = u.int_in_range(1..=4)?;
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 80 {
        ops.push(top(u)?);
    }
    Ok((verify_first, budget, ops))
}
