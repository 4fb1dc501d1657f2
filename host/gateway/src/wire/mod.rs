//! A raw JSON-RPC layer under rmcp on the gateway's two stdio connections (the
//! client's, [`front`]; a command upstream's, [`upstream`]).
//!
//! Why it exists: rmcp 3.11 models the newer SEP-2663 tasks *extension*, not
//! the tasks of MCP 2025-11-25 that servers speak today. Its typed model has
//! no `capabilities.tasks`, no `params.task` on `tools/call` and no tool
//! `execution`, so serde drops them; it parses a 2025-11-25 `CreateTaskResult`
//! as an empty tool result; and it answers `tasks/get` and `tasks/cancel`
//! itself (not found). So each stdio connection runs through a line pump that
//! reads every message before rmcp does (only its `id` and `method`, unless
//! it is one of the few below) and passes it on byte for byte, except:
//!
//! | message | rewritten |
//! | --- | --- |
//! | the upstream's `initialize` answer | its `capabilities.tasks` is kept for the gateway's own answer |
//! | the gateway's `initialize` answer | the part of the upstream's `tasks` the gateway honours is added ([`crate::tasks`]) |
//! | a client's `tools/call` with `params.task` (tasks declared) | `task` rides in `_meta["once/task"]` through rmcp and is put back on the way to the upstream |
//! | the gateway's own call as a task (a protected tool the upstream runs only as one) | the same under `_meta["once/own-task"]`; the task's status and `tasks/list` entry are kept from the client |
//! | an upstream's `tools/list` answer | each tool's `execution` rides in its `_meta["once/execution"]` and is put back on the way to the client |
//! | an upstream's `CreateTaskResult` answering a `tools/call` | it rides as a tool result's `_meta["once/created-task"]` and goes to the client as the upstream sent it |
//! | a client's `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel` (tasks declared) | routed around both rmcp instances to the upstream, under an id of the gateway's; the answer comes back raw; a client's cancellation of one follows it |
//! | an upstream's `notifications/tasks/status` | handed to the client's stdio as written (rmcp would add an empty `_meta`), once its task is known to be the client's; none over HTTP |
//!
//! Whatever the upstream or a client puts under these `_meta` keys itself is
//! removed on the way in: only this layer writes them. Nothing here decides
//! what is protected: a `tools/call` still goes through rmcp and the engine,
//! and the gateway refuses a task for any tool it does not send DIRECT.

pub mod front;
pub mod upstream;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf,
};
use tokio::sync::mpsc;

/// A `tools/call`'s `params.task`, carried through rmcp in `_meta`.
pub const TASK_META: &str = "once/task";
/// The same for a task the gateway itself runs for a protected call (never shown to the client).
pub const OWN_TASK_META: &str = "once/own-task";
/// A tool's `execution` (and whether its `_meta` was added for it), carried through rmcp in the tool's `_meta`.
pub const EXECUTION_META: &str = "once/execution";
/// A `CreateTaskResult` answering a `tools/call`, carried through rmcp in a tool result's `_meta`.
pub const CREATED_TASK_META: &str = "once/created-task";

/// The `tasks/*` methods of MCP 2025-11-25 a client sends a server.
pub const TASK_METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

/// The largest message either side may send (rmcp's own cap on a stdio line).
const MAX_LINE: usize = 16 * 1024 * 1024;
/// Bytes buffered between a pump and rmcp.
const PIPE: usize = 64 * 1024;

/// One JSON-RPC message, without its newline.
pub type Line = Vec<u8>;

/// rmcp's end of a spliced connection: serve or connect rmcp over it.
pub type RmcpIo = (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>);

/// What a message says of itself, read without building the rest of it.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
}

/// A message's `id` and `method`, or `None` for a line that is not a JSON object (rmcp answers those).
fn envelope(line: &[u8]) -> Option<(Option<String>, Option<String>)> {
    let e: Envelope = serde_json::from_slice(line).ok()?;
    Some((e.id.filter(|id| !id.is_null()).map(|id| id.to_string()), e.method))
}

/// How one side of a splice treats the messages that cross it. Both directions run at once.
pub trait Rewrite: Send + Sync + 'static {
    /// A message from the outer side on its way to rmcp: passed on (perhaps rewritten), or consumed.
    fn inward(&self, line: Line) -> Option<Line>;
    /// A message from rmcp on its way to the outer side.
    fn outward(&self, line: Line) -> Option<Line>;
    /// The outer side closed its end: nothing more will come from it.
    fn outer_closed(&self) {}
}

/// Run the pumps between an outer byte stream and rmcp, through `rewrite`. `outer` is the channel the
/// outer side's writer reads (rmcp's messages and any the rewrite adds; `None` ends it) and `to_outer`
/// its receiving end. The outer writer stops when rmcp closes its end, so the outer side sees the close.
pub fn splice<R, W>(
    outer_read: R,
    outer_write: W,
    rewrite: std::sync::Arc<dyn Rewrite>,
    outer: mpsc::Sender<Option<Line>>,
    to_outer: mpsc::Receiver<Option<Line>>,
) -> RmcpIo
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (rmcp, ours) = tokio::io::duplex(PIPE);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(ours);
    let inward = rewrite.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(outer_read);
        while let Some(line) = read_line(&mut lines).await {
            if let Some(line) = inward.inward(line)
                && write_line(&mut to_rmcp, &line).await.is_err()
            {
                break;
            }
        }
        inward.outer_closed();
        let _ = to_rmcp.shutdown().await;
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(from_rmcp);
        while let Some(line) = read_line(&mut lines).await {
            if let Some(line) = rewrite.outward(line)
                && outer.send(Some(line)).await.is_err()
            {
                break;
            }
        }
        let _ = outer.send(None).await;
    });
    tokio::spawn(write_out(outer_write, to_outer));
    tokio::io::split(rmcp)
}

/// Write what comes on `lines` to `out`, one message a line, until `None` or every sender is gone.
async fn write_out<W: AsyncWrite + Unpin>(mut out: W, mut lines: mpsc::Receiver<Option<Line>>) {
    while let Some(Some(line)) = lines.recv().await {
        if write_line(&mut out, &line).await.is_err() {
            break;
        }
    }
    let _ = out.shutdown().await;
}

async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, line: &[u8]) -> std::io::Result<()> {
    out.write_all(line).await?;
    out.write_all(b"\n").await?;
    out.flush().await
}

/// The next non-empty line, without its newline (and a `\r` before it); `None` at the end or on a read
/// error. A line longer than rmcp would take is skipped whole, as rmcp skips one (a peer that never
/// sends a newline must not grow the buffer without bound).
async fn read_line<R: AsyncRead + Unpin>(lines: &mut BufReader<R>) -> Option<Line> {
    let mut skipping = false;
    loop {
        let mut line = Vec::new();
        let read = (&mut *lines)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        let whole = line.last() == Some(&b'\n');
        if skipping || line.len() - usize::from(whole) > MAX_LINE {
            if !skipping {
                tracing::warn!(target: "once::gateway", "a message longer than {MAX_LINE} bytes was dropped");
            }
            skipping = !whole;
            continue;
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if !line.is_empty() {
            return Some(line);
        }
    }
}

/// The object at `key` of `value`, made if missing.
fn object_at<'a>(value: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    value
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
}

/// The tool objects of a `tools/list` result.
fn tools_mut(result: &mut Map<String, Value>) -> impl Iterator<Item = &mut Map<String, Value>> {
    result
        .get_mut("tools")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Remove `key` from `holder["_meta"]`, and `_meta` itself when that leaves it empty; the value removed.
fn take_meta(holder: &mut Map<String, Value>, key: &str) -> Option<Value> {
    let meta = holder.get_mut("_meta")?.as_object_mut()?;
    let taken = meta.remove(key);
    if taken.is_some() && meta.is_empty() {
        holder.remove("_meta");
    }
    taken
}

/// A message as a line again.
fn line_of(message: &Value) -> Line {
    serde_json::to_vec(message).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_envelope_is_its_id_and_method() {
        assert_eq!(
            envelope(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":[1,2]}}"#),
            Some((Some("7".to_string()), Some("tools/call".to_string())))
        );
        // A string id stays apart from the number it spells.
        assert_eq!(
            envelope(br#"{"id":"7","result":{}}"#),
            Some((Some("\"7\"".to_string()), None))
        );
        assert_eq!(envelope(br#"{"id":null,"error":{}}"#), Some((None, None)));
        assert_eq!(envelope(b"not json"), None);
    }

    #[test]
    fn a_meta_key_taken_leaves_no_empty_meta_behind() {
        let mut holder = json!({"_meta": {"once/task": {"ttl": 5}}, "name": "t"});
        let holder = holder.as_object_mut().unwrap();
        assert_eq!(take_meta(holder, "once/task"), Some(json!({"ttl": 5})));
        assert_eq!(Value::Object(holder.clone()), json!({"name": "t"}));
        let mut kept = json!({"_meta": {"once/task": {}, "trace": "a"}});
        let kept = kept.as_object_mut().unwrap();
        assert_eq!(take_meta(kept, "once/task"), Some(json!({})));
        assert_eq!(Value::Object(kept.clone()), json!({"_meta": {"trace": "a"}}));
        assert_eq!(take_meta(kept, "once/task"), None);
    }

    #[tokio::test]
    async fn lines_are_read_whole_without_their_newlines() {
        let text: &[u8] = b"{\"a\":1}\r\n\n{\"b\":2}\n{\"c\":3}";
        let mut lines = BufReader::new(text);
        assert_eq!(read_line(&mut lines).await, Some(b"{\"a\":1}".to_vec()));
        assert_eq!(read_line(&mut lines).await, Some(b"{\"b\":2}".to_vec()));
        assert_eq!(read_line(&mut lines).await, Some(b"{\"c\":3}".to_vec()));
        assert_eq!(read_line(&mut lines).await, None);
    }
}
