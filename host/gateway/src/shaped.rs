//! Every result shaped for the protocol revision its request speaks.
//!
//! A client on MCP 2026-07-28 rejects a result without `resultType` (the
//! TypeScript SDK 2.x and the Python SDK 2.x both do), and it rejects it
//! after the gateway has made the call: a refund made, then refused by the
//! client, is the worst answer there is. Results reach the client from four
//! places: the upstream's own answer (an upstream on an older revision, or
//! one answering in its session's older revision, writes none), a receipt
//! replayed from the ledger (stored as the upstream wrote it, whenever that
//! was), the gateway's own answers (unknown, conflict, blocked), and results
//! rmcp builds. So the server methods (`crate::server`) pass every result
//! through [`Complete`] on the way out, rather than each place minding it.
//!
//! The discriminator is set on every typed result, whatever the client's
//! revision: rmcp takes `resultType: "complete"` off again for a client on an
//! older revision (which does not know the field), and fills the cache hints
//! 2026-07-28 requires on list results. A `CustomResult` is raw JSON that rmcp
//! does not touch, so [`custom`] adds the field only for a request on
//! 2026-07-28 or later.

use rmcp::model::{
    CallToolResult, CompleteResult, CustomResult, GetPromptResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, ProtocolVersion, ReadResourceResult, ResultType,
};

/// A result that names its `resultType`.
pub trait Complete {
    /// The result, with `resultType: "complete"` where it named none: it came whole (from the upstream,
    /// the ledger or the gateway), and nothing about it is pending.
    fn complete(self) -> Self;
}

macro_rules! complete_by_field {
    ($($result:ty),* $(,)?) => {$(
        impl Complete for $result {
            fn complete(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

complete_by_field!(
    CallToolResult,
    CompleteResult,
    GetPromptResult,
    ListPromptsResult,
    ListResourceTemplatesResult,
    ListResourcesResult,
    ListToolsResult,
    ReadResourceResult,
);

/// Whether a request speaking `version` is on 2026-07-28 or later (the dates compare as text).
pub fn is_stateless_revision(version: Option<&ProtocolVersion>) -> bool {
    version.is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// A pass-through answer of a method rmcp does not know, for a request on `version`: an object without
/// `resultType` gets `complete` on 2026-07-28 or later, and is left as it was on older revisions.
pub fn custom(mut result: CustomResult, version: Option<&ProtocolVersion>) -> CustomResult {
    if is_stateless_revision(version)
        && let Some(object) = result.0.as_object_mut()
    {
        object
            .entry("resultType")
            .or_insert_with(|| ResultType::COMPLETE.as_str().into());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock;
    use serde_json::json;

    #[test]
    fn a_result_without_a_discriminator_is_complete_and_one_with_one_keeps_it() {
        // As a stored receipt or an older upstream's answer arrives: no `resultType`.
        let stored: CallToolResult =
            serde_json::from_value(json!({"content": [{"type": "text", "text": "r"}]})).unwrap();
        assert_eq!(stored.result_type, None);
        let shaped = serde_json::to_value(stored.complete()).unwrap();
        assert_eq!(shaped["resultType"], "complete");
        assert_eq!(shaped["content"][0]["text"], "r");

        let listed: ListToolsResult = serde_json::from_value(json!({"tools": []})).unwrap();
        assert_eq!(listed.result_type, None);
        assert_eq!(listed.complete().result_type, Some(ResultType::COMPLETE));

        let mut other = CallToolResult::success(vec![ContentBlock::text("x")]);
        other.result_type = Some(ResultType::INPUT_REQUIRED);
        assert_eq!(other.complete().result_type, Some(ResultType::INPUT_REQUIRED));
    }

    #[test]
    fn a_custom_result_names_itself_complete_only_on_2026_07_28() {
        let modern = Some(&ProtocolVersion::V_2026_07_28);
        let shaped = custom(CustomResult(json!({"tasks": []})), modern);
        assert_eq!(shaped.0, json!({"tasks": [], "resultType": "complete"}));
        let kept = custom(CustomResult(json!({"resultType": "task"})), modern);
        assert_eq!(kept.0, json!({"resultType": "task"}));
        let legacy = custom(CustomResult(json!({"tasks": []})), Some(&ProtocolVersion::V_2025_11_25));
        assert_eq!(legacy.0, json!({"tasks": []}));
        assert_eq!(custom(CustomResult(json!({})), None).0, json!({}));
    }
}
