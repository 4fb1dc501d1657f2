//! The raw layer between the client's stdio and the gateway's rmcp server:
//! it adds the tasks the gateway honours to its `initialize` answer, carries a
//! `tools/call`'s `task` into rmcp in `_meta`, puts each tool's `execution`
//! and a `CreateTaskResult` back as the upstream wrote them, and routes the
//! `tasks/*` methods (and a client's cancellation of one) to the upstream
//! around rmcp. Until the gateway has declared tasks, none of this happens:
//! a `task` is then ignored (rmcp drops it) and `tasks/*` are rmcp's to refuse.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::upstream::Answer;
use super::{
    CREATED_TASK_META, EXECUTION_META, Line, OWN_TASK_META, Rewrite, RmcpIo, TASK_META, TASK_METHODS, envelope,
    line_of, object_at, take_meta, tools_mut,
};
use crate::handler::Shared;

/// Messages queued for the client's stdout.
const QUEUE: usize = 64;

/// What the client asked whose answer this layer rewrites.
enum Asked {
    Initialize,
    ToolsList,
    ToolsCall,
}

#[derive(Default)]
struct State {
    /// The client's requests, by id.
    asked: HashMap<String, Asked>,
    /// Whether the gateway's `initialize` answer declared tasks.
    tasks: bool,
    /// `tasks/*` requests routed to the upstream, by the client's id: their cancellation.
    routed: HashMap<String, CancellationToken>,
}

/// The client connection's raw layer.
pub struct FrontWire {
    shared: Arc<Shared>,
    state: Arc<Mutex<State>>,
    to_client: mpsc::Sender<Option<Line>>,
}

/// Splice the client's stdin and stdout; the gateway's rmcp server goes on the returned end.
pub fn splice<R, W>(stdin: R, stdout: W, shared: Arc<Shared>) -> RmcpIo
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (to_client, queue) = mpsc::channel(QUEUE);
    shared.upstream.relay().connect_raw(to_client.clone());
    let wire = Arc::new(FrontWire {
        shared,
        state: Arc::new(Mutex::new(State::default())),
        to_client: to_client.clone(),
    });
    super::splice(stdin, stdout, wire, to_client, queue)
}

impl FrontWire {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send a client's `tasks/*` request to the upstream around rmcp; its answer goes back under the client's id.
    fn route(&self, id: String, mut message: Value) {
        let method = message["method"].as_str().unwrap_or_default().to_string();
        let params = message.get_mut("params").map(Value::take);
        let client_id = message.get_mut("id").map(Value::take).unwrap_or(Value::Null);
        let ct = CancellationToken::new();
        self.state().routed.insert(id.clone(), ct.clone());
        let (shared, state, to_client) = (self.shared.clone(), self.state.clone(), self.to_client.clone());
        tokio::spawn(async move {
            let answered = shared.upstream.raw_request(&method, params, &ct, None).await;
            state.lock().unwrap_or_else(|p| p.into_inner()).routed.remove(&id);
            // A request the client cancelled is not answered.
            if ct.is_cancelled() {
                return;
            }
            let mut reply = json!({"jsonrpc": "2.0", "id": client_id});
            match answered {
                Ok(Answer::Result(result)) => reply["result"] = result,
                Ok(Answer::Error(error)) => reply["error"] = error,
                Err(why) => reply["error"] = json!({"code": -32603, "message": why}),
            }
            let _ = to_client.send(Some(line_of(&reply))).await;
        });
    }
}

impl Rewrite for FrontWire {
    fn inward(&self, line: Line) -> Option<Line> {
        let Some((id, Some(method))) = envelope(&line) else {
            return Some(line);
        };
        let Some(id) = id else {
            // A notification: the client's cancellation of a routed request goes where the request went.
            if method == "notifications/cancelled"
                && let Ok(message) = serde_json::from_slice::<Value>(&line)
                && let Some(cancelled) = message["params"].get("requestId").map(Value::to_string)
                && let Some(ct) = self.state().routed.remove(&cancelled)
            {
                ct.cancel();
                return None;
            }
            return Some(line);
        };
        let mut state = self.state();
        match method.as_str() {
            "initialize" => {
                state.asked.insert(id, Asked::Initialize);
                Some(line)
            }
            "tools/list" => {
                state.asked.insert(id, Asked::ToolsList);
                Some(line)
            }
            "tools/call" => {
                state.asked.insert(id, Asked::ToolsCall);
                let tasks = state.tasks;
                drop(state);
                match serde_json::from_slice::<Value>(&line) {
                    Ok(mut message) => Some(if tuck_task(&mut message, tasks) {
                        line_of(&message)
                    } else {
                        line
                    }),
                    Err(_) => Some(line),
                }
            }
            m if state.tasks && TASK_METHODS.contains(&m) => {
                drop(state);
                match serde_json::from_slice::<Value>(&line) {
                    Ok(message) => {
                        self.route(id, message);
                        None
                    }
                    Err(_) => Some(line),
                }
            }
            _ => Some(line),
        }
    }

    fn outward(&self, line: Line) -> Option<Line> {
        let Some((Some(id), None)) = envelope(&line) else {
            return Some(line);
        };
        let Some(asked) = self.state().asked.remove(&id) else {
            return Some(line);
        };
        let Ok(mut message) = serde_json::from_slice::<Value>(&line) else {
            return Some(line);
        };
        let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
            return Some(line);
        };
        let changed = match asked {
            Asked::Initialize => match self.shared.upstream.declared_tasks() {
                Some(tasks) => {
                    declare_tasks(result, tasks);
                    self.state().tasks = true;
                    true
                }
                None => false,
            },
            Asked::ToolsList => restore_executions(result),
            Asked::ToolsCall => unwrap_created_task(result),
        };
        Some(if changed { line_of(&message) } else { line })
    }
}

/// A client's `tools/call`: whatever it put under once's key goes; its `task`, when the gateway declared
/// tasks, rides in `_meta` through rmcp. Whether anything changed.
fn tuck_task(message: &mut Value, tasks: bool) -> bool {
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let mut changed = take_meta(params, TASK_META).is_some() | take_meta(params, OWN_TASK_META).is_some();
    if tasks && let Some(task) = params.remove("task") {
        if let Some(meta) = object_at(params, "_meta") {
            meta.insert(TASK_META.to_string(), task);
        }
        changed = true;
    }
    changed
}

/// The gateway's `initialize` answer, with the tasks it honours.
fn declare_tasks(result: &mut Map<String, Value>, tasks: Value) {
    if let Some(capabilities) = object_at(result, "capabilities") {
        capabilities.insert("tasks".to_string(), tasks);
    }
}

/// Each tool's `execution` back where the upstream wrote it (as the gateway presents it). Whether any was.
fn restore_executions(result: &mut Map<String, Value>) -> bool {
    let mut changed = false;
    for tool in tools_mut(result) {
        let Some(mut tucked) = tool
            .get_mut("_meta")
            .and_then(Value::as_object_mut)
            .and_then(|m| m.remove(EXECUTION_META))
        else {
            continue;
        };
        changed = true;
        if tucked["metaAdded"] == Value::Bool(true)
            && tool.get("_meta").and_then(Value::as_object).is_some_and(Map::is_empty)
        {
            tool.remove("_meta");
        }
        if let Some(execution) = tucked.get_mut("execution").map(Value::take) {
            tool.insert("execution".to_string(), execution);
        }
    }
    changed
}

/// A `CreateTaskResult` the upstream answered a call with, as it sent it. Whether there was one.
fn unwrap_created_task(result: &mut Map<String, Value>) -> bool {
    match take_meta(result, CREATED_TASK_META) {
        Some(Value::Object(created)) => {
            *result = created;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_task_rides_in_meta_only_once_tasks_are_declared() {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "research", "task": {"ttl": 1000},
            "_meta": {"once/task": "the client's own", "once/own-task": {}, "trace": "t"},
        }});
        let mut declared = call.clone();
        assert!(tuck_task(&mut declared, true));
        assert_eq!(
            declared["params"],
            json!({"name": "research", "_meta": {"once/task": {"ttl": 1000}, "trace": "t"}})
        );
        // Without tasks declared the field stays for rmcp to drop; once's key is still nobody else's.
        let mut undeclared = call.clone();
        assert!(tuck_task(&mut undeclared, false));
        assert_eq!(
            undeclared["params"],
            json!({"name": "research", "task": {"ttl": 1000}, "_meta": {"trace": "t"}})
        );
        let mut plain = json!({"method": "tools/call", "params": {"name": "echo"}});
        assert!(!tuck_task(&mut plain, true));
    }

    #[test]
    fn executions_and_created_tasks_come_back_as_the_upstream_wrote_them() {
        let mut listed = json!({"tools": [
            {"name": "a", "_meta": {"once/execution": {"execution": {"taskSupport": "required"}, "metaAdded": true}}},
            {"name": "b", "_meta": {"x": 1, "once/execution": {"execution": {"taskSupport": "forbidden"}, "metaAdded": false}}},
            {"name": "c", "_meta": {}},
        ]});
        assert!(restore_executions(listed.as_object_mut().unwrap()));
        assert_eq!(
            listed,
            json!({"tools": [
                {"name": "a", "execution": {"taskSupport": "required"}},
                {"name": "b", "_meta": {"x": 1}, "execution": {"taskSupport": "forbidden"}},
                {"name": "c", "_meta": {}},
            ]})
        );
        let created = json!({"task": {"taskId": "t1", "status": "working"}});
        let mut answer = json!({"content": [], "_meta": {"once/created-task": created}});
        assert!(unwrap_created_task(answer.as_object_mut().unwrap()));
        assert_eq!(answer, created);
        let mut plain = json!({"content": [{"type": "text", "text": "hi"}]});
        assert!(!unwrap_created_task(plain.as_object_mut().unwrap()));
    }

    #[test]
    fn the_initialize_answer_gets_the_honoured_tasks() {
        let mut result = json!({"capabilities": {"tools": {}}, "serverInfo": {"name": "once-gateway"}});
        declare_tasks(result.as_object_mut().unwrap(), json!({"list": {}}));
        assert_eq!(result["capabilities"], json!({"tools": {}, "tasks": {"list": {}}}));
    }
}
