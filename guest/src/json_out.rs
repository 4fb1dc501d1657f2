//! JSON text written by hand, byte for byte as serde_json writes the same
//! value: members in declaration order, no spaces, serde's escapes and the
//! enum cases' UpperCamelCase names. Record bodies (`body`) and the hot
//! path's crossings (`wire`) use it; serde's own writer escapes every field
//! name and grows its buffer as it goes, which was the largest single cost
//! of a protected call. Each user's tests compare its output with serde's.

use alloc::string::String;

use crate::canon::write_string;
use crate::types::{Confirmation, Effect, IdentityMode, KeySource, Repeat, ReplayVia, Route, State, Table};

/// A JSON object or array being written: each member is preceded by a comma
/// unless it opens its container.
pub(crate) struct Writer(pub(crate) String);

impl Writer {
    /// An empty text with room for `n` bytes.
    pub(crate) fn with_capacity(n: usize) -> Writer {
        Writer(String::with_capacity(n))
    }
    /// `"name":`, after a comma unless the object (or array) was just opened.
    pub(crate) fn key(&mut self, name: &str) {
        if !matches!(self.0.as_bytes().last(), Some(b'{' | b'[')) {
            self.0.push(',');
        }
        // Field names are plain ASCII identifiers: nothing to escape.
        self.0.push('"');
        self.0.push_str(name);
        self.0.push_str("\":");
    }
    /// A member whose value is JSON text already.
    pub(crate) fn raw(&mut self, name: &str, json: &str) {
        self.key(name);
        self.0.push_str(json);
    }
    /// A string member.
    pub(crate) fn str(&mut self, name: &str, value: &str) {
        self.key(name);
        write_string(value, &mut self.0);
    }
    /// A string member, or `null`.
    pub(crate) fn opt_str(&mut self, name: &str, value: Option<&str>) {
        match value {
            Some(v) => self.str(name, v),
            None => self.raw(name, "null"),
        }
    }
    /// A boolean member.
    pub(crate) fn bool(&mut self, name: &str, value: bool) {
        self.raw(name, if value { "true" } else { "false" });
    }
    /// An integer member.
    pub(crate) fn num(&mut self, name: &str, value: u64) {
        self.key(name);
        push_u64(&mut self.0, value);
    }
    /// An integer member, or `null`.
    pub(crate) fn opt_num(&mut self, name: &str, value: Option<u64>) {
        match value {
            Some(v) => self.num(name, v),
            None => self.raw(name, "null"),
        }
    }
    /// An array of `items`, each written by `item`.
    pub(crate) fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Writer, &T)) {
        self.0.push('[');
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            item(self, x);
        }
        self.0.push(']');
    }
}

/// The decimal digits of `n`.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(core::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// A `state` case as JSON.
pub(crate) fn state(s: State) -> &'static str {
    match s {
        State::InFlight => "\"InFlight\"",
        State::Confirmed => "\"Confirmed\"",
        State::Failed => "\"Failed\"",
        State::Unknown => "\"Unknown\"",
        State::Absent => "\"Absent\"",
        State::Superseded => "\"Superseded\"",
        State::AwaitingApproval => "\"AwaitingApproval\"",
        State::Denied => "\"Denied\"",
    }
}

/// A `key-source` case as JSON.
pub(crate) fn key_source(k: KeySource) -> &'static str {
    match k {
        KeySource::Application => "\"Application\"",
        KeySource::Derived => "\"Derived\"",
    }
}

/// A `confirmation` case as JSON.
pub(crate) fn confirmation(c: Confirmation) -> &'static str {
    match c {
        Confirmation::Answer => "\"Answer\"",
        Confirmation::Provider => "\"Provider\"",
        Confirmation::Operator => "\"Operator\"",
    }
}

/// An `identity-mode` case as JSON.
pub(crate) fn identity(i: IdentityMode) -> &'static str {
    match i {
        IdentityMode::Required => "\"Required\"",
        IdentityMode::Derived => "\"Derived\"",
    }
}

/// A `route` case as JSON.
pub(crate) fn route(r: Route) -> &'static str {
    match r {
        Route::Direct => "\"Direct\"",
        Route::Protect => "\"Protect\"",
        Route::Block => "\"Block\"",
    }
}

/// A `replay-via` case as JSON.
pub(crate) fn replay_via(v: ReplayVia) -> &'static str {
    match v {
        ReplayVia::Key => "\"Key\"",
        ReplayVia::DerivedArgs => "\"DerivedArgs\"",
        ReplayVia::Provider => "\"Provider\"",
    }
}

/// An `effect` case as JSON.
pub(crate) fn effect(e: Effect) -> &'static str {
    match e {
        Effect::Happened => "\"Happened\"",
        Effect::None => "\"None\"",
        Effect::Unknown => "\"Unknown\"",
    }
}

/// A `repeat` case as JSON.
pub(crate) fn repeat(r: Repeat) -> &'static str {
    match r {
        Repeat::Replays => "\"Replays\"",
        Repeat::Waits => "\"Waits\"",
        Repeat::Retries => "\"Retries\"",
        Repeat::Refused => "\"Refused\"",
    }
}

/// A `table` case as JSON.
pub(crate) fn table(t: Table) -> &'static str {
    match t {
        Table::Operation => "\"Operation\"",
        Table::Tombstone => "\"Tombstone\"",
        Table::Quota => "\"Quota\"",
    }
}
