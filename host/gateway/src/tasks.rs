//! The tasks of MCP 2025-11-25 through the gateway (carried past rmcp by
//! [`crate::wire`]): what the gateway declares, how a tool's `execution`
//! reads through it, and why a task for a tool once does not send DIRECT is
//! refused.
//!
//! - Declared only on stdio in front of a command upstream (the two wires the
//!   layer runs on), and only what passes through: the upstream's `list`,
//!   `cancel` and `requests.tools.call`.
//! - A DIRECT tool keeps its `execution`; a call of it as a task, the task
//!   handle and `tasks/*` pass through as the upstream answers them.
//! - A tool once protects or blocks is presented without tasks: `optional`
//!   reads `forbidden` (called without a task, it runs to its end through
//!   once), and so does `required` when the gateway can run the upstream's
//!   task itself inside the protected call (the intent is recorded before
//!   the task is created; the task's result is the call's outcome). A task
//!   the gateway stopped waiting for may still act, however long after:
//!   until it ends, reconciliation reads it as UNKNOWN, never absent
//!   (`handler::task_evidence`).
//! - A call of such a tool as a task is refused with -32601 before the engine
//!   sees it: nothing is claimed, recorded or sent.

use once::types::Route;
use rmcp::model::{ErrorCode, ErrorData, Tool};
use serde_json::{Map, Value, json};

use crate::wire::EXECUTION_META;

/// The part of the upstream's `capabilities.tasks` the gateway honours, or `None` when that is nothing.
pub fn honoured(upstream: &Value) -> Option<Value> {
    let mut declared = Map::new();
    for part in ["list", "cancel"] {
        if let Some(value) = upstream.get(part).filter(|v| v.is_object()) {
            declared.insert(part.to_string(), value.clone());
        }
    }
    if let Some(call) = upstream.pointer("/requests/tools/call").filter(|v| v.is_object()) {
        declared.insert("requests".to_string(), json!({"tools": {"call": call}}));
    }
    (!declared.is_empty()).then_some(Value::Object(declared))
}

/// Whether an upstream that declared `tasks` runs `tools/call` as tasks.
pub fn runs_calls_as_tasks(tasks: Option<&Value>) -> bool {
    tasks
        .and_then(|t| t.pointer("/requests/tools/call"))
        .is_some_and(Value::is_object)
}

/// The tool's `taskSupport` as the upstream listed it (carried in `_meta` by the wire), if it said one.
pub fn task_support(tool: &Tool) -> Option<&str> {
    tool.meta
        .as_ref()?
        .get(EXECUTION_META)?
        .pointer("/execution/taskSupport")?
        .as_str()
}

/// How the gateway presents one listed tool. Over HTTP the `execution` is not carried (no wire there):
/// it is removed, as rmcp would have. Else a tool that is not DIRECT is offered without tasks: `optional`
/// becomes `forbidden`, and `required` too when the gateway runs the upstream's task itself (`drives`).
pub fn present(tool: &mut Tool, direct: bool, drives: bool, over_http: bool) {
    let Some(meta) = tool.meta.as_mut() else {
        return;
    };
    if over_http {
        if let Some(tucked) = meta.remove(EXECUTION_META)
            && tucked["metaAdded"] == Value::Bool(true)
            && meta.is_empty()
        {
            tool.meta = None;
        }
        return;
    }
    if direct {
        return;
    }
    let Some(support) = meta
        .get_mut(EXECUTION_META)
        .and_then(|t| t.pointer_mut("/execution/taskSupport"))
    else {
        return;
    };
    if support == "optional" || (support == "required" && drives) {
        *support = Value::String("forbidden".to_string());
    }
}

/// The answer to a call of `tool` as a task when once does not send it DIRECT (its `route`, and why it
/// is blocked if it is): -32601, as MCP has a server answer a task for a tool that takes none, with what
/// to do instead.
pub fn refused(tool: &str, route: Route, blocked: Option<&str>) -> ErrorData {
    let message = match (blocked, route) {
        (Some(why), _) => format!(
            "once gateway: {tool} is blocked by once ({why}): it is never sent, as a task or otherwise. Nothing was \
             sent."
        ),
        (None, Route::Block) => format!(
            "once gateway: {tool} is routed BLOCK by once: it is never sent, as a task or otherwise. Nothing was \
             sent."
        ),
        _ => format!(
            "once gateway: {tool} is protected by once (routed PROTECT), and a protected call cannot run as a task \
             through the gateway: once records the call's own outcome before it answers. Nothing was sent. Call \
             {tool} without `task`: the gateway runs it to its end and answers its result."
        ),
    };
    ErrorData::new(ErrorCode::METHOD_NOT_FOUND, message, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(meta: Value) -> Tool {
        serde_json::from_value(json!({"name": "t", "inputSchema": {}, "_meta": meta})).unwrap()
    }

    fn tucked(support: &str, added: bool) -> Value {
        json!({ EXECUTION_META: {"execution": {"taskSupport": support}, "metaAdded": added} })
    }

    #[test]
    fn only_what_passes_through_is_declared() {
        let everything = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}, "sampling": {"x": {}}},
            "future": {}});
        assert_eq!(
            honoured(&everything),
            Some(json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}))
        );
        assert!(runs_calls_as_tasks(Some(&everything)));
        assert_eq!(honoured(&json!({"future": {}})), None);
        assert_eq!(honoured(&json!({"list": true})), None);
        assert!(!runs_calls_as_tasks(Some(&json!({"list": {}}))));
        assert!(!runs_calls_as_tasks(None));
    }

    #[test]
    fn a_tool_once_does_not_send_direct_is_offered_without_tasks() {
        let mut optional = tool(tucked("optional", true));
        assert_eq!(task_support(&optional), Some("optional"));
        present(&mut optional, false, false, false);
        assert_eq!(task_support(&optional), Some("forbidden"));

        let mut required = tool(tucked("required", true));
        present(&mut required, false, false, false);
        assert_eq!(
            task_support(&required),
            Some("required"),
            "nobody runs its task: it stays as it is"
        );
        present(&mut required, false, true, false);
        assert_eq!(task_support(&required), Some("forbidden"));

        let mut direct = tool(tucked("optional", true));
        present(&mut direct, true, true, false);
        assert_eq!(task_support(&direct), Some("optional"));
    }

    #[test]
    fn over_http_no_execution_is_carried() {
        let mut added = tool(tucked("required", true));
        present(&mut added, true, true, true);
        assert!(added.meta.is_none());
        let mut own = tool(json!({"x": 1, EXECUTION_META: {"execution": {}, "metaAdded": false}}));
        present(&mut own, false, true, true);
        assert_eq!(serde_json::to_value(&own.meta).unwrap(), json!({"x": 1}));
    }

    #[test]
    fn a_task_for_a_protected_or_blocked_tool_is_refused_as_method_not_found() {
        let e = refused("refund", Route::Protect, None);
        assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND);
        assert!(e.message.contains("refund is protected by once"), "{}", e.message);
        assert!(e.message.contains("Call refund without `task`"), "{}", e.message);
        assert!(refused("refund", Route::Block, None).message.contains("routed BLOCK"));
        let pinned = refused("refund", Route::Protect, Some("descriptor-changed"));
        assert!(
            pinned.message.contains("blocked by once (descriptor-changed)"),
            "{}",
            pinned.message
        );
    }
}
