//! The engine's record cache (`store::RecordCache`): a record read back is
//! taken from the cache only when its row body is byte-for-byte the one the
//! engine committed; any other body is parsed, so a store that rewrote the
//! row (another writer, a restored or recreated ledger) is always seen.

mod common;

use common::*;
use once_guest::host::Host;
use once_guest::store::{RecordCache, decode, load};
use once_guest::testing::MemoryHost;
use once_guest::types::{Error, FinishAck, State, Table};

#[test]
fn a_record_read_back_is_exactly_the_one_parsing_its_row_gives() {
    let h = MemoryHost::new();
    let grant = execute_of(go(&h, refund("k1", ARGS)));
    let row = h.row(Table::Operation, "s", "k1").unwrap();
    let parsed = decode(&row).unwrap();
    // The cache holds what the begin committed: taken, it equals the parsed row.
    let cached = load(&h, "s", "k1").unwrap().unwrap();
    assert_eq!(cached.rec, parsed.rec);
    assert_eq!(cached.version, parsed.version);
    assert_eq!(cached.rec.attempts[0].fence, grant.fence);
    // Handed out once: the next read parses (and agrees).
    assert_eq!(load(&h, "s", "k1").unwrap().unwrap().rec, parsed.rec);
}

#[test]
fn a_row_rewritten_at_the_same_version_is_parsed_not_taken_from_the_cache() {
    let h = MemoryHost::new();
    let grant = execute_of(go(&h, refund("k1", ARGS)));
    // Another writer's record at the same scope, key and version (a ledger restored or
    // recreated underneath this engine): a different attempt holds it.
    let mut row = h.row(Table::Operation, "s", "k1").unwrap();
    let theirs = "1-00000000000000000000000000000000";
    row.body = row.body.replace(&grant.fence, theirs);
    assert_ne!(row.body, h.row(Table::Operation, "s", "k1").unwrap().body);
    h.put_row(row.clone());
    let loaded = load(&h, "s", "k1").unwrap().unwrap();
    assert_eq!(
        loaded.rec.attempts[0].fence, theirs,
        "the stored row, not the cached record"
    );
    // The engine acts on the stored record: this grant's fence is not one of its attempts.
    assert_eq!(
        once_guest::engine::finish(&h, "s", "k1", &grant.fence, success(RECEIPT)),
        Err(Error::FenceMismatch)
    );
    assert_eq!(
        fin(&h, "k1", theirs, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
}

#[test]
fn the_cache_hands_out_only_an_identical_body() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k1", ARGS)));
    let row = h.row(Table::Operation, "s", "k1").unwrap();
    let cache = RecordCache::new();
    assert!(cache.take(&row.body).is_none(), "an empty cache");
    let kept = h.record_cache().expect("the memory host keeps one");
    // One byte more (a trailing space, still the same JSON record) is another body.
    assert!(kept.take(&format!("{} ", row.body)).is_none());
    assert_eq!(kept.take(&row.body).map(|r| r.key), Some("k1".to_string()));
    assert!(kept.take(&row.body).is_none(), "taken once");
}
