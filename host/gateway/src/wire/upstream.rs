//! The raw layer between rmcp's client and a command upstream's stdio: it
//! keeps the upstream's `capabilities.tasks`, puts a `tools/call`'s `task`
//! back where the upstream reads it, carries each tool's `execution` and a
//! `CreateTaskResult` through rmcp in `_meta`, sends the gateway's own
//! requests (`tasks/*`) to the upstream beside rmcp's, taking their answers
//! before rmcp sees them, and hands `notifications/tasks/status` to the
//! client as the upstream wrote them. A task the gateway runs for a protected
//! call is its own: the client hears no status of it and `tasks/list` leaves
//! it out.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{
    CREATED_TASK_META, EXECUTION_META, Line, OWN_TASK_META, Rewrite, RmcpIo, TASK_META, envelope, line_of, take_meta,
    tools_mut,
};
use crate::relay::Relay;

/// Messages queued for the upstream's stdin.
const QUEUE: usize = 64;
/// How the ids of this layer's own requests begin, as JSON text (rmcp's ids are numbers).
const OWN_ID: &str = "\"once-";

/// The upstream's answer to a request this layer sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Its `result`.
    Result(Value),
    /// Its `error` object, as it sent it.
    Error(Value),
}

/// Why a request this layer sent got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    /// The connection to the upstream closed first.
    #[error("the connection to the upstream closed before it answered")]
    Closed,
    /// The asker stopped waiting (the upstream was told to stop).
    #[error("cancelled before the upstream answered")]
    Cancelled,
    /// No answer in time (the upstream was told to stop).
    #[error("the upstream did not answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
}

/// What rmcp asked whose answer this layer reads.
enum Asked {
    Initialize,
    ToolsList,
    /// A call; as a task (`Some`), the client's or the gateway's own (`Some(true)`).
    ToolsCall {
        task: Option<bool>,
    },
}

/// Where the answer to one of this layer's own requests goes.
struct Own {
    answer: oneshot::Sender<Answer>,
    /// A `tasks/list`: the gateway's own tasks are left out of it.
    list: bool,
}

#[derive(Default)]
struct State {
    /// rmcp's requests, by id.
    asked: HashMap<String, Asked>,
    /// This layer's own requests, by id: where their answers go.
    own: HashMap<String, Own>,
    /// The ids of the tasks the gateway runs for protected calls.
    own_tasks: HashSet<String>,
    /// The ids of the client's tasks.
    client_tasks: HashSet<String>,
    /// Calls as tasks not answered yet: a status notification may come before the task's id does.
    creating: usize,
    /// Status notifications of tasks not known yet, held until the calls being created are answered.
    held: Vec<(String, Line)>,
    /// The upstream's `capabilities.tasks`, from its `initialize` answer.
    tasks: Option<Value>,
    /// The upstream's stdout ended.
    closed: bool,
}

/// One upstream connection's raw layer.
pub struct UpstreamWire {
    state: Mutex<State>,
    to_upstream: mpsc::Sender<Option<Line>>,
    next: AtomicU64,
    /// Where task status notifications go: the client, when one is connected on stdio.
    relay: Arc<Relay>,
}

impl UpstreamWire {
    /// Splice the upstream's stdout and stdin; rmcp's client goes on the returned end.
    pub fn splice<R, W>(stdout: R, stdin: W, relay: Arc<Relay>) -> (RmcpIo, Arc<UpstreamWire>)
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (to_upstream, queue) = mpsc::channel(QUEUE);
        let wire = Arc::new(UpstreamWire {
            state: Mutex::new(State::default()),
            to_upstream: to_upstream.clone(),
            next: AtomicU64::new(1),
            relay,
        });
        let rmcp = super::splice(stdout, stdin, wire.clone(), to_upstream, queue);
        (rmcp, wire)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `capabilities.tasks` the upstream declared when it was initialized, as it wrote it.
    pub fn tasks(&self) -> Option<Value> {
        self.state().tasks.clone()
    }

    /// Send `method` to the upstream under an id of this layer's and wait for the answer, `ct` or
    /// `timeout`, whichever comes first; when the wait is given up, the upstream is told to stop.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        ct: &CancellationToken,
        timeout: Option<Duration>,
    ) -> Result<Answer, Unanswered> {
        let id = format!("{}{}", &OWN_ID[1..], self.next.fetch_add(1, Ordering::Relaxed));
        let key = Value::String(id.clone()).to_string();
        let (answer, answered) = oneshot::channel();
        {
            let mut state = self.state();
            if state.closed {
                return Err(Unanswered::Closed);
            }
            let list = method == "tasks/list";
            state.own.insert(key.clone(), Own { answer, list });
        }
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(params) = params {
            request["params"] = params;
        }
        // Guarded from here: the send may wait for room in the queue, and its future may be dropped there.
        let mut pending = Pending {
            wire: self,
            id: Some((id, key)),
        };
        if self.to_upstream.send(Some(line_of(&request))).await.is_err() {
            if let Some((_, key)) = pending.id.take() {
                self.state().own.remove(&key);
            }
            return Err(Unanswered::Closed);
        }
        let wait = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        // Biased: an answer that has arrived wins over a deadline that is also due (see `Upstream::exchange`).
        let given_up = tokio::select! {
            biased;
            answer = answered => {
                pending.id = None;
                return answer.map_err(|_| Unanswered::Closed);
            }
            _ = ct.cancelled() => Unanswered::Cancelled,
            _ = wait => Unanswered::TimedOut(timeout.unwrap_or_default()),
        };
        if let Some((id, key)) = pending.id.take() {
            self.state().own.remove(&key);
            let _ = self.to_upstream.send(Some(cancelled(&id, &given_up.to_string()))).await;
        }
        Err(given_up)
    }

    /// An answer from the upstream: to one of this layer's requests (taken), or to rmcp's (perhaps rewritten).
    fn answer(&self, id: &str, line: Line) -> Option<Line> {
        let mut state = self.state();
        if let Some(waiter) = state.own.remove(id) {
            let mut message: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
            if waiter.list
                && let Some(tasks) = message.pointer_mut("/result/tasks").and_then(Value::as_array_mut)
            {
                tasks.retain(|t| t["taskId"].as_str().is_none_or(|id| !state.own_tasks.contains(id)));
            }
            drop(state);
            let answer = match (message.get("result"), message.get("error")) {
                (Some(result), _) => Answer::Result(result.clone()),
                (None, Some(error)) => Answer::Error(error.clone()),
                (None, None) => Answer::Error(json!({"code": -32603, "message": "the upstream answered nothing"})),
            };
            let _ = waiter.answer.send(answer);
            return None;
        }
        let Some(asked) = state.asked.remove(id) else {
            // A late answer to a request of this layer's that was given up: rmcp never asked it.
            return (!id.starts_with(OWN_ID)).then_some(line);
        };
        let creating = matches!(asked, Asked::ToolsCall { task: Some(_) });
        let passed = rmcps_answer(&mut state, asked, line);
        if creating {
            state.creating -= 1;
            self.release(&mut state);
        }
        passed
    }

    /// rmcp gave up a request: a call as a task it gave up will not name its task to anyone.
    fn cancelled(&self, line: &[u8]) {
        let Ok(message) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        let Some(id) = message.pointer("/params/requestId").map(Value::to_string) else {
            return;
        };
        let mut state = self.state();
        if matches!(state.asked.get(&id), Some(Asked::ToolsCall { task: Some(_) })) {
            state.asked.remove(&id);
            state.creating -= 1;
            self.release(&mut state);
        }
    }

    /// Pass on the held status notifications whose task is now known to be the client's (or all of them,
    /// once no call as a task is waiting for its answer); drop those of the gateway's own tasks.
    fn release(&self, state: &mut State) {
        let held = std::mem::take(&mut state.held);
        for (task, line) in held {
            if state.own_tasks.contains(&task) {
                continue;
            }
            if state.creating == 0 || state.client_tasks.contains(&task) {
                self.relay.tell_raw(line);
            } else {
                state.held.push((task, line));
            }
        }
    }

    /// A task status notification: to the client as written, unless the task is the gateway's own. One
    /// may come before the answer that names its task: while a call as a task is unanswered, a status of
    /// a task not known yet is held until it is.
    fn status(&self, line: Line) {
        let Some(task) = status_task(&line) else {
            self.relay.tell_raw(line);
            return;
        };
        let mut state = self.state();
        if state.own_tasks.contains(&task) {
            return;
        }
        if state.creating > 0 && !state.client_tasks.contains(&task) {
            state.held.push((task, line));
            return;
        }
        self.relay.tell_raw(line);
    }
}

/// An answer to one of rmcp's requests that this layer reads, perhaps rewritten.
fn rmcps_answer(state: &mut State, asked: Asked, line: Line) -> Option<Line> {
    let Ok(mut message) = serde_json::from_slice::<Value>(&line) else {
        return Some(line);
    };
    let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
        return Some(line);
    };
    match asked {
        Asked::Initialize => {
            state.tasks = result.get("capabilities").and_then(|c| c.get("tasks")).cloned();
            Some(line)
        }
        Asked::ToolsList => {
            tools_mut(result).for_each(tuck_execution);
            Some(line_of(&message))
        }
        Asked::ToolsCall { task } => {
            let forged = take_meta(result, CREATED_TASK_META).is_some();
            if !forged && !is_created_task(result) {
                return Some(line);
            }
            if is_created_task(result) {
                if let Some(id) = result["task"]["taskId"].as_str() {
                    let known = if task == Some(true) {
                        &mut state.own_tasks
                    } else {
                        &mut state.client_tasks
                    };
                    known.insert(id.to_string());
                }
                let created = std::mem::take(result);
                result.insert("content".to_string(), json!([]));
                result.insert("_meta".to_string(), json!({ CREATED_TASK_META: created }));
            }
            Some(line_of(&message))
        }
    }
}

/// A `tools/call` answer that is a task handle (`CreateTaskResult`), not the call's result.
fn is_created_task(result: &Map<String, Value>) -> bool {
    result
        .get("task")
        .and_then(|t| t.get("taskId"))
        .is_some_and(Value::is_string)
}

/// Move a tool's `execution` into its `_meta`, where rmcp keeps it (only this layer's value stays there).
fn tuck_execution(tool: &mut Map<String, Value>) {
    take_meta(tool, EXECUTION_META);
    let Some(execution) = tool.remove("execution") else {
        return;
    };
    let added = !tool.contains_key("_meta");
    if let Some(meta) = super::object_at(tool, "_meta") {
        meta.insert(
            EXECUTION_META.to_string(),
            json!({"execution": execution, "metaAdded": added}),
        );
    }
}

/// Put a `tools/call`'s `task` back from `_meta` into its params: the client's, or the gateway's own
/// (`Some(true)`). `None`: not a task.
fn untuck_task(message: &mut Value) -> Option<bool> {
    let params = message.get_mut("params").and_then(Value::as_object_mut)?;
    let (task, own) = match take_meta(params, OWN_TASK_META) {
        Some(task) => (task, true),
        None => (take_meta(params, TASK_META)?, false),
    };
    params.insert("task".to_string(), task);
    Some(own)
}

/// The task a `notifications/tasks/status` is about.
fn status_task(line: &[u8]) -> Option<String> {
    let message: Value = serde_json::from_slice(line).ok()?;
    message.pointer("/params/taskId")?.as_str().map(str::to_string)
}

/// The notification that tells the upstream to stop this layer's request `id`.
fn cancelled(id: &str, reason: &str) -> Line {
    line_of(&json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": reason},
    }))
}

/// A request of this layer's waiting for its answer. Its future dropped first (the engine's loop stops a
/// dispatch at its deadline), the upstream is told to stop it, as when the wait is given up.
struct Pending<'a> {
    wire: &'a UpstreamWire,
    /// The request's id and its key in `own`; none once answered or given up.
    id: Option<(String, String)>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some((id, key)) = self.id.take() {
            self.wire.state().own.remove(&key);
            // A drop cannot wait: a full queue (a wedged upstream) loses the notification, only a request.
            let _ = self
                .wire
                .to_upstream
                .try_send(Some(cancelled(&id, "the gateway stopped waiting for the answer")));
        }
    }
}

impl Rewrite for UpstreamWire {
    fn inward(&self, line: Line) -> Option<Line> {
        match envelope(&line) {
            // An answer (no method): to rmcp's request or this layer's.
            Some((Some(id), None)) => self.answer(&id, line),
            // rmcp would add an empty `_meta` to it: it goes to the client as written, unless the task is the gateway's.
            Some((None, Some(method))) if method == "notifications/tasks/status" => {
                self.status(line);
                None
            }
            _ => Some(line),
        }
    }

    fn outward(&self, line: Line) -> Option<Line> {
        let Some((id, Some(method))) = envelope(&line) else {
            return Some(line);
        };
        let Some(id) = id else {
            if method == "notifications/cancelled" {
                self.cancelled(&line);
            }
            return Some(line);
        };
        let asked = match method.as_str() {
            "initialize" => Asked::Initialize,
            "tools/list" => Asked::ToolsList,
            "tools/call" => {
                let Ok(mut message) = serde_json::from_slice::<Value>(&line) else {
                    return Some(line);
                };
                let task = untuck_task(&mut message);
                let mut state = self.state();
                state.asked.insert(id, Asked::ToolsCall { task });
                state.creating += usize::from(task.is_some());
                drop(state);
                return Some(if task.is_some() { line_of(&message) } else { line });
            }
            _ => return Some(line),
        };
        self.state().asked.insert(id, asked);
        Some(line)
    }

    fn outer_closed(&self) {
        let mut state = self.state();
        state.closed = true;
        // Their askers hear `Closed`.
        state.own.clear();
        state.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> (Arc<UpstreamWire>, mpsc::Receiver<Option<Line>>) {
        let (to_upstream, queue) = mpsc::channel(QUEUE);
        let wire = Arc::new(UpstreamWire {
            state: Mutex::new(State::default()),
            to_upstream,
            next: AtomicU64::new(1),
            relay: Arc::new(Relay::default()),
        });
        (wire, queue)
    }

    fn json_of(line: Option<Line>) -> Value {
        serde_json::from_slice(&line.expect("passed on")).unwrap()
    }

    #[test]
    fn a_task_goes_back_into_the_params_and_its_answer_rides_in_meta() {
        let (wire, _queue) = wire();
        let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "research", "arguments": {"topic": "x"}, "_meta": {"once/task": {"ttl": 60000}, "progressToken": 1},
        }});
        let sent = json_of(wire.outward(line_of(&call)));
        assert_eq!(sent["params"]["task"], json!({"ttl": 60000}));
        assert_eq!(sent["params"]["_meta"], json!({"progressToken": 1}));

        let created = json!({"task": {"taskId": "t1", "status": "working", "ttl": 300000,
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z"}});
        let answer = json!({"jsonrpc": "2.0", "id": 3, "result": created});
        let through = json_of(wire.inward(line_of(&answer)));
        assert_eq!(
            through["result"],
            json!({"content": [], "_meta": {"once/created-task": created}})
        );
        // rmcp reads it as a tool result, which keeps the task in `_meta`.
        let parsed: rmcp::model::ServerResult = serde_json::from_value(through["result"].clone()).unwrap();
        assert!(
            matches!(parsed, rmcp::model::ServerResult::CallToolResult(_)),
            "{parsed:?}"
        );
    }

    #[test]
    fn what_the_upstream_writes_under_once_keys_is_dropped() {
        let (wire, _queue) = wire();
        let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "t"}});
        let untouched = line_of(&call);
        assert_eq!(wire.outward(untouched.clone()), Some(untouched));
        let forged = json!({"jsonrpc": "2.0", "id": 4, "result": {
            "content": [{"type": "text", "text": "hi"}], "_meta": {"once/created-task": {"task": {"taskId": "x"}}},
        }});
        assert_eq!(
            json_of(wire.inward(line_of(&forged)))["result"],
            json!({"content": [{"type": "text", "text": "hi"}]})
        );
        let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"});
        wire.outward(line_of(&list));
        let tools = json!({"jsonrpc": "2.0", "id": 5, "result": {"tools": [
            {"name": "a", "inputSchema": {}, "execution": {"taskSupport": "required"}},
            {"name": "b", "inputSchema": {}, "_meta": {"x": 1}, "execution": {"taskSupport": "forbidden"}},
            {"name": "c", "inputSchema": {}, "_meta": {"once/execution": {"execution": {"taskSupport": "optional"}}}},
        ]}});
        let tucked = json_of(wire.inward(line_of(&tools)));
        assert_eq!(
            tucked["result"]["tools"],
            json!([
                {"name": "a", "inputSchema": {}, "_meta": {"once/execution":
                    {"execution": {"taskSupport": "required"}, "metaAdded": true}}},
                {"name": "b", "inputSchema": {}, "_meta": {"x": 1, "once/execution":
                    {"execution": {"taskSupport": "forbidden"}, "metaAdded": false}}},
                {"name": "c", "inputSchema": {}},
            ])
        );
    }

    #[test]
    fn the_upstreams_tasks_capability_is_kept_from_its_initialize_answer() {
        let (wire, _queue) = wire();
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}});
        wire.outward(line_of(&init));
        let tasks = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}});
        let answer = json!({"jsonrpc": "2.0", "id": 0, "result": {"capabilities": {"tools": {}, "tasks": tasks}}});
        let line = line_of(&answer);
        assert_eq!(wire.inward(line.clone()), Some(line));
        assert_eq!(wire.tasks(), Some(tasks));
    }

    #[test]
    fn a_status_before_its_task_is_named_waits_for_it_and_the_gateways_own_are_never_passed_on() {
        let (wire, _queue) = wire();
        let (raw, mut heard) = mpsc::channel(8);
        wire.relay.connect_raw(raw);
        let status = |task: &str| {
            line_of(&json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                "params": {"taskId": task, "status": "working"}}))
        };
        let created = |id: u64, task: &str| {
            line_of(&json!({"jsonrpc": "2.0", "id": id, "result": {"task": {"taskId": task, "status": "working"}}}))
        };
        let call = |id: u64, key: &str| {
            line_of(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "t", "_meta": {key: {}}}}))
        };
        wire.outward(call(1, "once/own-task"));
        wire.outward(call(2, "once/task"));
        // Both statuses come before the answers that name their tasks: held.
        assert_eq!(wire.inward(status("own")), None);
        assert_eq!(wire.inward(status("theirs")), None);
        assert!(heard.try_recv().is_err());
        wire.inward(created(1, "own"));
        assert!(heard.try_recv().is_err(), "the client's task is not named yet");
        wire.inward(created(2, "theirs"));
        assert_eq!(heard.try_recv().unwrap(), Some(status("theirs")));
        assert!(heard.try_recv().is_err(), "the gateway's own task is never heard of");
        // Once known, at once.
        assert_eq!(wire.inward(status("theirs")), None);
        assert_eq!(heard.try_recv().unwrap(), Some(status("theirs")));
        assert_eq!(wire.inward(status("own")), None);
        assert!(heard.try_recv().is_err());
        // A call as a task that rmcp gives up stops holding the others.
        wire.outward(call(3, "once/task"));
        assert_eq!(wire.inward(status("unknown")), None);
        assert!(heard.try_recv().is_err());
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}});
        wire.outward(line_of(&cancel));
        assert_eq!(heard.try_recv().unwrap(), Some(status("unknown")));
    }

    #[tokio::test]
    async fn the_layers_own_request_is_answered_before_rmcp_sees_it_and_cancelled_when_given_up() {
        let (wire, mut queue) = wire();
        let asking = {
            let wire = wire.clone();
            tokio::spawn(async move {
                wire.request(
                    "tasks/get",
                    Some(json!({"taskId": "t1"})),
                    &CancellationToken::new(),
                    None,
                )
                .await
            })
        };
        let sent = json_of(queue.recv().await.unwrap());
        assert_eq!(sent["method"], "tasks/get");
        assert_eq!(sent["params"], json!({"taskId": "t1"}));
        let answer = json!({"jsonrpc": "2.0", "id": sent["id"], "result": {"taskId": "t1", "status": "working"}});
        assert_eq!(wire.inward(line_of(&answer)), None);
        assert_eq!(
            asking.await.unwrap(),
            Ok(Answer::Result(json!({"taskId": "t1", "status": "working"})))
        );

        let ct = CancellationToken::new();
        let asking = {
            let (wire, ct) = (wire.clone(), ct.clone());
            tokio::spawn(async move { wire.request("tasks/result", None, &ct, None).await })
        };
        let sent = json_of(queue.recv().await.unwrap());
        ct.cancel();
        assert_eq!(asking.await.unwrap(), Err(Unanswered::Cancelled));
        let cancel = json_of(queue.recv().await.unwrap());
        assert_eq!(cancel["method"], "notifications/cancelled");
        assert_eq!(cancel["params"]["requestId"], sent["id"]);
        // A late answer to it is nobody's: rmcp never sees it either.
        let late = json!({"jsonrpc": "2.0", "id": sent["id"], "result": {}});
        assert_eq!(wire.inward(line_of(&late)), None);
        let rmcps = json!({"jsonrpc": "2.0", "id": 9, "result": {}});
        assert_eq!(wire.inward(line_of(&rmcps)), Some(line_of(&rmcps)));

        wire.outer_closed();
        let closed = wire.request("tasks/list", None, &CancellationToken::new(), None).await;
        assert_eq!(closed, Err(Unanswered::Closed));
    }
}
