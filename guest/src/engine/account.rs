//! The provider account a record is bound to (DESIGN.md "Authority"): a host
//! answers, sends and reads a record only through the account it was begun
//! under (its policy's `provider-account`, when it names one).

use alloc::format;
use alloc::string::String;

use super::begin::blocked;
use crate::host::Host;
use crate::mutant::{self, Mutant};
use crate::record::OpRecord;
use crate::types::{BlockReason, Decision};

/// Whether this host goes through another provider account than `rec` was begun under.
pub(crate) fn foreign(h: &impl Host, rec: &OpRecord) -> bool {
    rec.other_account(h.provider_account(&rec.tool).as_deref())
}

/// Whether this host may answer `rec`'s callers from it (a replay, its state, its rejection):
/// only through its own account. Another account is not handed its receipt.
pub(super) fn answers(h: &impl Host, rec: &OpRecord) -> bool {
    !foreign(h, rec) || mutant::on(Mutant::OtherAccountAnswered)
}

/// Whether this host's provider read can prove anything absent of `rec`: only a read through
/// its own account. A rotated credential (or another account's) may not see its effect.
pub(super) fn reads_own_account(h: &impl Host, rec: &OpRecord) -> bool {
    !foreign(h, rec) || mutant::on(Mutant::OtherAccountReadProvesAbsent)
}

/// The refusal of another account's record: neither replayed nor sent here.
pub(crate) fn refusal(h: &impl Host, rec: &OpRecord) -> Decision {
    blocked(
        BlockReason::OtherAccount,
        format!(
            "{} was begun through provider account {}, and this host's for tool {} is {}: another account's \
             operation is neither answered nor sent here (a host on its own account answers it)",
            rec.key,
            named(rec.policy.provider_account.as_deref()),
            rec.tool,
            named(h.provider_account(&rec.tool).as_deref())
        ),
    )
}

/// Why this host's read of `rec`, which found nothing as of `read_position`, proves nothing.
pub(super) fn absence_unproven(h: &impl Host, rec: &OpRecord, read_position: u64) -> String {
    format!(
        "absent as of {read_position} through provider account {}, but it was sent through {}, which that account \
         may not see: only a read through its own account, or an operator, settles it",
        named(h.provider_account(&rec.tool).as_deref()),
        named(rec.policy.provider_account.as_deref())
    )
}

fn named(account: Option<&str>) -> String {
    account.map_or_else(|| String::from("(none named)"), String::from)
}

/// Why this host leaves `rec` unread (the audit's words).
pub(super) fn left_unread(h: &impl Host, rec: &OpRecord) -> String {
    format!(
        "not read through provider account {}: it was sent through {}, which that account may not see; a read \
         through its own account, or an operator, settles it",
        named(h.provider_account(&rec.tool).as_deref()),
        named(rec.policy.provider_account.as_deref())
    )
}
