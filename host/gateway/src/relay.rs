//! What the upstream sends unasked, relayed to the client: its notifications
//! (progress under the client's own token, log messages, resource updates,
//! list changes) and the requests only the client can answer (sampling,
//! elicitation, roots), whose answers go back. A `tools/list_changed` also
//! re-reads the tool list the gateway routes and pins by.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

#[allow(deprecated)] // sampling, roots, logging: deprecated by a newer protocol revision, used on the older ones
use rmcp::model::{
    ClientConfig, ClientResult, CreateMessageRequestParams, CreateMessageResult, CustomNotification, CustomRequest,
    CustomResult, ElicitRequestParams, ElicitResult, ErrorData, ListRootsResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, Request, RequestNoParam, ResourceUpdatedNotificationParam,
    ServerNotification, ServerRequest, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RequestContext, ServiceRole};
use rmcp::{ClientHandler, RoleClient, RoleServer, ServiceError};
use tokio_util::sync::CancellationToken;

/// The `_meta` key a followed call's request carries from [`Followers::follow`] to [`Following`], which takes it
/// off before the request leaves: the mark of its follower, bound there to the progress token the SDK gave it.
pub const FOLLOW_META: &str = "once/follow";

/// Where one followed call's progress is queued for its client. Unbounded: the connection that fills it
/// carries every call's answers, and must never wait on one client taking its progress.
type Queue = tokio::sync::mpsc::UnboundedSender<ProgressNotificationParam>;

/// The calls in flight on one upstream connection whose progress the client asked for: where each call's
/// progress is queued. One per connection: each connection numbers its tokens from the same start.
pub struct Followers {
    relay: Arc<Relay>,
    /// Marks handed out so far.
    marks: std::sync::atomic::AtomicU64,
    calls: Mutex<Calls>,
}

#[derive(Default)]
struct Calls {
    /// Calls whose request has not been handed to the connection yet, by mark.
    unsent: HashMap<u64, Queue>,
    /// Calls whose request was, by the upstream's progress token (and their mark).
    sent: HashMap<ProgressToken, (u64, Queue)>,
}

impl Followers {
    /// The calls of a new connection, whose progress goes to `relay`'s client (or each call's own connection).
    pub fn new(relay: Arc<Relay>) -> Followers {
        Followers {
            relay,
            marks: std::sync::atomic::AtomicU64::new(0),
            calls: Mutex::default(),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Relay the progress of the call whose request carries the returned guard's [`ProgressGuard::mark`] in
    /// its `_meta` under [`FOLLOW_META`] as the client's `client` token, to the connection `to` (the
    /// connected client when `None`), in the order the upstream sent it, until the guard settles or drops.
    /// Followed before the request is sent, its progress is relayed however soon the upstream reports it.
    pub fn follow(self: &Arc<Followers>, client: ProgressToken, to: Option<Peer<RoleServer>>) -> ProgressGuard {
        let (queue, mut queued) = tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
        let mark = self.marks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.calls().unsent.insert(mark, queue);
        let relay = self.relay.clone();
        // One sender per call, so its notifications reach the client one after the other, as they came.
        let relaying = tokio::spawn(async move {
            while let Some(mut params) = queued.recv().await {
                params.progress_token = client.clone();
                let notification = ServerNotification::ProgressNotification(rmcp::model::Notification::new(params));
                match &to {
                    Some(peer) => {
                        if let Err(e) = peer.send_notification(notification).await {
                            tracing::debug!(target: "once::gateway", "a progress notification did not reach its client: {e}");
                        }
                    }
                    None => relay.tell(notification).await,
                }
            }
        });
        ProgressGuard {
            followers: self.clone(),
            mark,
            relaying: Some(relaying),
        }
    }

    /// A call's request on its way to the upstream: its follower (if its mark is one of this connection's)
    /// now follows the progress token the request carries. The mark goes either way: it is nobody else's.
    fn sending(&self, request: &mut rmcp::model::ClientRequest) {
        use rmcp::model::GetMeta;
        let meta = request.get_meta_mut();
        let Some(mark) = meta.remove(FOLLOW_META) else {
            return;
        };
        let token = meta.get_progress_token();
        let mut calls = self.calls();
        if let (Some(mark), Some(token)) = (mark.as_u64(), token)
            && let Some(queue) = calls.unsent.remove(&mark)
        {
            calls.sent.insert(token, (mark, queue));
        }
    }

    /// Follow the call marked `mark` no more.
    fn forget(&self, mark: u64) {
        let mut calls = self.calls();
        calls.unsent.remove(&mark);
        calls.sent.retain(|_, (m, _)| *m != mark);
    }
}

/// An upstream connection's transport that takes each progress notification of a followed call off the
/// connection as it is read, in the order the upstream wrote, and queues it for the call's client. The SDK
/// would hand each notification to a task of its own, which may run after the call's answer (read later)
/// was handed over, and in any order; what is queued here before the answer is read is relayed before the
/// answer is ([`ProgressGuard::settle`]).
pub struct Following<T> {
    inner: T,
    followers: Arc<Followers>,
}

impl<T> Following<T> {
    /// `inner`, whose followed calls' progress goes to `followers`.
    pub fn new(inner: T, followers: Arc<Followers>) -> Following<T> {
        Following { inner, followers }
    }
}

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient> for Following<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Bound before the request can leave, so no progress of the call can come before its follower is there.
        if let rmcp::model::JsonRpcMessage::Request(request) = &mut item {
            self.followers.sending(&mut request.request);
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            let rmcp::model::JsonRpcMessage::Notification(rmcp::model::JsonRpcNotification {
                notification: ServerNotification::ProgressNotification(progress),
                ..
            }) = message
            else {
                return Some(message);
            };
            // Progress of no followed call (its client asked none, or the call is over) goes nowhere.
            if let Some((_, queue)) = self.followers.calls().sent.get(&progress.params.progress_token) {
                let _ = queue.send(progress.params);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// The gateway's link to its client, shared by every upstream connection.
#[derive(Default)]
pub struct Relay {
    client: RwLock<Option<Peer<RoleServer>>>,
    /// The client's stdio below rmcp (`crate::wire`), for what goes to it as the upstream wrote it.
    raw: RwLock<Option<tokio::sync::mpsc::Sender<Option<crate::wire::Line>>>>,
    /// The upstream's tools as last listed.
    tools: RwLock<Vec<Tool>>,
}

impl Relay {
    /// From now on, relay to this client.
    pub fn connect(&self, client: Peer<RoleServer>) {
        *self.client.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
    }

    /// From now on, hand raw messages to the client's stdio through `sender`.
    pub fn connect_raw(&self, sender: tokio::sync::mpsc::Sender<Option<crate::wire::Line>>) {
        *self.raw.write().unwrap_or_else(|p| p.into_inner()) = Some(sender);
    }

    /// Hand one message to the client as written, if it is connected on stdio (over HTTP nobody could take it).
    /// A full queue is not waited on here: the message follows when there is room.
    pub fn tell_raw(&self, line: crate::wire::Line) {
        let Some(raw) = self.raw.read().unwrap_or_else(|p| p.into_inner()).clone() else {
            return;
        };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(line)) = raw.try_send(Some(line)) {
            tokio::spawn(async move {
                let _ = raw.send(line).await;
            });
        }
    }

    fn client(&self) -> Option<Peer<RoleServer>> {
        self.client.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The tools as last listed.
    pub fn tools(&self) -> Vec<Tool> {
        self.tools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Route and pin by this list from now on.
    pub fn set_tools(&self, tools: Vec<Tool>) {
        *self.tools.write().unwrap_or_else(|p| p.into_inner()) = tools;
    }

    /// Send a notification to the client, if one is connected (nobody else could use it).
    pub async fn tell(&self, notification: ServerNotification) {
        if let Some(client) = self.client()
            && let Err(e) = client.send_notification(notification).await
        {
            tracing::debug!(target: "once::gateway", "a notification did not reach the client: {e}");
        }
    }

    /// Ask the client what only it can answer; its answer (or error) is the upstream's.
    async fn ask(&self, request: ServerRequest, ct: &CancellationToken) -> Result<ClientResult, ErrorData> {
        let client = self
            .client()
            .ok_or_else(|| ErrorData::internal_error("no client is connected to the gateway to answer this", None))?;
        ask(&client, request, PeerRequestOptions::no_options(), ct).await
    }
}

/// Ends the relay of one call's progress: when dropped (the call was given up), nothing more is queued; by
/// [`ProgressGuard::settle`] once all that was queued has been relayed.
pub struct ProgressGuard {
    followers: Arc<Followers>,
    mark: u64,
    relaying: Option<tokio::task::JoinHandle<()>>,
}

impl ProgressGuard {
    /// What the call's request carries in its `_meta` under [`FOLLOW_META`].
    pub fn mark(&self) -> u64 {
        self.mark
    }

    /// Stop following, then wait until each progress notification of the call that the upstream's connection
    /// read before the call's answer has reached the client, so that none comes after the answer: a client
    /// drops progress of a call it has the answer of, and over HTTP the answer ends the stream.
    pub async fn settle(mut self) {
        // The queue's only sender goes: its relay ends once what is queued is sent.
        self.followers.forget(self.mark);
        if let Some(relaying) = self.relaying.take() {
            let _ = relaying.await;
        }
    }
}

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        self.followers.forget(self.mark);
    }
}

/// Send `request` to `peer` and wait for its answer; when `ct` fires first, tell the peer to stop.
pub async fn ask<R: ServiceRole>(
    peer: &Peer<R>,
    request: R::Req,
    options: PeerRequestOptions,
    ct: &CancellationToken,
) -> Result<R::PeerResp, ErrorData> {
    let mut handle = peer
        .send_request_with_option(request, options)
        .await
        .map_err(error_of)?;
    // Biased: an answer that has arrived wins over a cancellation that is also due.
    tokio::select! {
        biased;
        answer = &mut handle.rx => match answer {
            Ok(answer) => answer.map_err(error_of),
            Err(_) => Err(error_of(ServiceError::TransportClosed)),
        },
        _ = ct.cancelled() => {
            let _ = handle.cancel(Some("cancelled by the gateway's client".to_string())).await;
            Err(ErrorData::internal_error("cancelled by the client", None))
        }
    }
}

/// A failed exchange as the JSON-RPC error the other side is answered with: the peer's own error as it sent it.
pub fn error_of(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        e => ErrorData::internal_error(format!("the exchange with the upstream broke: {e}"), None),
    }
}

fn unexpected(what: &str) -> ErrorData {
    ErrorData::internal_error(format!("the client answered {what} with something else"), None)
}

/// The gateway as the upstream's client: one per upstream connection, with the client's capabilities.
#[derive(Clone)]
pub struct RelayHandler {
    /// Where to relay.
    pub relay: Arc<Relay>,
    /// What the gateway declares to the upstream: its client's capabilities.
    pub config: ClientConfig,
}

// Sampling, roots and logging are deprecated by a newer protocol revision; upstreams on the older ones use them.
#[allow(deprecated)]
impl ClientHandler for RelayHandler {
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(Request::new(params));
        match self.relay.ask(request, &context.ct).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            _ => Err(unexpected("sampling/createMessage")),
        }
    }

    async fn list_roots(&self, context: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        let request = ServerRequest::ListRootsRequest(RequestNoParam::default());
        match self.relay.ask(request, &context.ct).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            _ => Err(unexpected("roots/list")),
        }
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let request = ServerRequest::ElicitRequest(Request::new(request));
        match self.relay.ask(request, &context.ct).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(unexpected("elicitation/create")),
        }
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        let method = request.method.clone();
        match self
            .relay
            .ask(ServerRequest::CustomRequest(request), &context.ct)
            .await?
        {
            ClientResult::CustomResult(result) => Ok(result),
            _ => Err(unexpected(&method)),
        }
    }

    async fn on_progress(&self, _params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        // Only progress of a call the client asked progress for reaches it, and that never comes here: the
        // connection relays it in order ([`Following`]).
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay
            .tell(ServerNotification::LoggingMessageNotification(
                rmcp::model::Notification::new(params),
            ))
            .await;
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay
            .tell(ServerNotification::ResourceUpdatedNotification(
                rmcp::model::Notification::new(params),
            ))
            .await;
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relay
            .tell(ServerNotification::ResourceListChangedNotification(Default::default()))
            .await;
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.relay
            .tell(ServerNotification::PromptListChangedNotification(Default::default()))
            .await;
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        // Re-read before the client hears of it: a call it makes next is routed and pinned by the new list.
        match context.peer.list_all_tools().await {
            Ok(tools) => self.relay.set_tools(tools),
            Err(e) => {
                tracing::warn!(target: "once::gateway", "re-reading the upstream's tools after list_changed: {e}")
            }
        }
        self.relay
            .tell(ServerNotification::ToolListChangedNotification(Default::default()))
            .await;
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay
            .tell(ServerNotification::CustomNotification(notification))
            .await;
    }

    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
    use rmcp::transport::Transport;
    use rmcp::{RoleServer, ServerHandler};
    use serde_json::{Value, json};

    use super::*;

    /// A connection's far end: what was sent on it, and what it is to read next.
    struct Wire {
        sent: Arc<Mutex<Vec<Value>>>,
        incoming: tokio::sync::mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
    }

    impl Transport<RoleClient> for Wire {
        type Error = std::io::Error;

        fn send(
            &mut self,
            item: ClientJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            self.sent.lock().unwrap().push(serde_json::to_value(&item).unwrap());
            std::future::ready(Ok(()))
        }

        async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
            self.incoming.recv().await
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    /// The gateway's client: the progress it was told, as (token, progress).
    #[derive(Clone, Default)]
    struct Client(Arc<Mutex<Vec<(Value, f64)>>>);

    impl Transport<RoleServer> for Client {
        type Error = std::io::Error;

        fn send(
            &mut self,
            item: ServerJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            if let rmcp::model::JsonRpcMessage::Notification(n) = &item
                && let ServerNotification::ProgressNotification(p) = &n.notification
            {
                let token = serde_json::to_value(&p.params.progress_token).unwrap();
                self.0.lock().unwrap().push((token, p.params.progress));
            }
            std::future::ready(Ok(()))
        }

        async fn receive(&mut self) -> Option<rmcp::model::ClientJsonRpcMessage> {
            std::future::pending().await
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    #[derive(Clone)]
    struct Nothing;
    impl ServerHandler for Nothing {}

    fn call(id: u64, meta: Value) -> ClientJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "steps", "_meta": meta}}))
        .unwrap()
    }

    fn progress(token: u64, progress: u64) -> ServerJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": token, "progress": progress}}))
        .unwrap()
    }

    #[tokio::test]
    async fn a_calls_progress_is_bound_as_its_request_leaves_and_relayed_in_order_before_its_answer() {
        let relay = Arc::new(Relay::default());
        let client = Client::default();
        let serving = rmcp::service::serve_directly(Nothing, client.clone(), None);
        relay.connect(serving.peer().clone());
        let followers = Arc::new(Followers::new(relay));
        let (upstream, incoming) = tokio::sync::mpsc::unbounded_channel();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let mut wire = Following::new(
            Wire {
                sent: sent.clone(),
                incoming,
            },
            followers.clone(),
        );

        let followed = followers.follow(ProgressToken(rmcp::model::NumberOrString::String("mine".into())), None);
        wire.send(call(1, json!({"progressToken": 7, FOLLOW_META: followed.mark()})))
            .await
            .unwrap();
        // A mark that is no call's of this connection (a client's own) binds nothing, and neither travels.
        wire.send(call(2, json!({"progressToken": 8, FOLLOW_META: followed.mark() + 1})))
            .await
            .unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent[0]["params"]["_meta"], json!({"progressToken": 7}));
        assert_eq!(sent[1]["params"]["_meta"], json!({"progressToken": 8}));

        // The upstream reports at once, then answers: the progress is taken off the connection as it is read.
        for step in 1..=3 {
            upstream.send(progress(7, step)).unwrap();
        }
        upstream.send(progress(8, 1)).unwrap();
        upstream
            .send(serde_json::from_value(json!({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})).unwrap())
            .unwrap();
        let answer = serde_json::to_value(wire.receive().await.unwrap()).unwrap();
        assert_eq!(answer["id"], 1, "{answer}");
        followed.settle().await;
        assert_eq!(
            client.0.lock().unwrap().clone(),
            vec![(json!("mine"), 1.0), (json!("mine"), 2.0), (json!("mine"), 3.0)]
        );
    }
}
