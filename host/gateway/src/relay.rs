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

/// Where one call's progress goes: the client's token, and the connection (none: the connected client).
type Follower = (ProgressToken, Option<Peer<RoleServer>>);

/// One progress notification on its way to the client: counted so `settle_progress` waits for it.
struct Relaying<'a>(&'a Relay);

impl<'a> Relaying<'a> {
    fn start(relay: &'a Relay) -> Relaying<'a> {
        relay.relaying.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Relaying(relay)
    }
}

impl Drop for Relaying<'_> {
    fn drop(&mut self) {
        self.0.relaying.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The gateway's link to its client, shared by every upstream connection.
#[derive(Default)]
pub struct Relay {
    client: RwLock<Option<Peer<RoleServer>>>,
    /// The client's stdio below rmcp (`crate::wire`), for what goes to it as the upstream wrote it.
    raw: RwLock<Option<tokio::sync::mpsc::Sender<Option<crate::wire::Line>>>>,
    /// The upstream's progress token of a call in flight -> the client's token for it, and the
    /// connection that call came on (over HTTP, each request's own; else the one client).
    progress: Mutex<HashMap<ProgressToken, Follower>>,
    /// Progress notifications being relayed right now.
    relaying: std::sync::atomic::AtomicUsize,
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

    /// Relay progress the upstream reports under `upstream` as the client's `client` token, to the connection
    /// `to` (the connected client when `None`), until the guard drops.
    pub fn follow_progress(
        self: &Arc<Relay>,
        upstream: ProgressToken,
        client: ProgressToken,
        to: Option<Peer<RoleServer>>,
    ) -> ProgressGuard {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(upstream.clone(), (client, to));
        ProgressGuard {
            relay: self.clone(),
            token: upstream,
        }
    }

    /// Let progress the upstream sent before a call's answer reach the client before the answer does:
    /// the SDK hands each notification to a task of its own, which may not have run yet.
    pub async fn settle_progress(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_millis(200);
        while self.relaying.load(std::sync::atomic::Ordering::SeqCst) > 0 && tokio::time::Instant::now() < give_up {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
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

/// Ends the relay of one call's progress.
pub struct ProgressGuard {
    relay: Arc<Relay>,
    token: ProgressToken,
}

/// How long a call's progress is still relayed after its answer came: the SDK handles each
/// notification in a task of its own, so the last one can be handled just after the answer.
const PROGRESS_STRAGGLERS: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        let (relay, token) = (self.relay.clone(), self.token.clone());
        let forget = move || {
            relay.progress.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    tokio::time::sleep(PROGRESS_STRAGGLERS).await;
                    forget();
                });
            }
            Err(_) => forget(),
        }
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
    tokio::select! {
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

    async fn on_progress(&self, mut params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        // Only progress of a call the client asked progress for, under the token it chose.
        let client_token = self
            .relay
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&params.progress_token)
            .cloned();
        if let Some((token, to)) = client_token {
            let _relaying = Relaying::start(&self.relay);
            params.progress_token = token;
            let notification = ServerNotification::ProgressNotification(rmcp::model::Notification::new(params));
            match to {
                Some(peer) => {
                    if let Err(e) = peer.send_notification(notification).await {
                        tracing::debug!(target: "once::gateway", "a progress notification did not reach its client: {e}");
                    }
                }
                None => self.relay.tell(notification).await,
            }
        }
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
