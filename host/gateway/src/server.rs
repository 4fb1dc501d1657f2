//! The MCP server the client talks to. `tools/call` runs through once
//! ([`Gateway::call`]); every other method the upstream serves — prompts,
//! resources and their subscriptions, completions, logging, ping, methods
//! this SDK does not name — passes through with its `_meta`, progress and
//! cancellation, and its answer or error is the upstream's own. The gateway
//! declares the upstream's capabilities (less what it cannot relay, below)
//! and the upstream's instructions followed by once's.

#[allow(deprecated)] // logging: deprecated by a newer protocol revision, used by clients on the older ones
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientNotification, ClientRequest, CompleteRequestParams, CompleteResult,
    CustomRequest, CustomResult, ErrorCode, ErrorData, GetPromptRequestParams, GetPromptResponse, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, Request, RequestNoParam,
    RequestOptionalParam, ServerCapabilities, ServerConfig, ServerPeerInfo, ServerResult, SetLevelRequestParams,
    SubscribeRequestParams, Tool, ToolsCapability, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};

use crate::handler::Gateway;
use crate::shaped::Complete;
use crate::upstream::Link;

/// The capabilities the gateway declares: the upstream's, but not its protocol
/// extensions (the tasks extension among them: a task would carry a protected
/// call past the engine), and always tools.
pub fn capabilities(upstream: Option<&ServerPeerInfo>) -> ServerCapabilities {
    let mut capabilities = upstream.map(|u| u.capabilities.clone()).unwrap_or_default();
    capabilities.extensions = None;
    if capabilities.tools.is_none() {
        capabilities.tools = Some(ToolsCapability::default());
    }
    capabilities
}

/// The upstream's instructions as it wrote them, then what once adds.
pub fn instructions(upstream: Option<&ServerPeerInfo>, once: &str) -> String {
    match upstream.and_then(|u| u.instructions.as_deref()) {
        Some(theirs) if !theirs.trim().is_empty() => format!("{theirs}\n\n{once}"),
        _ => once.to_string(),
    }
}

fn link(context: &RequestContext<RoleServer>) -> Link {
    Link {
        client: Some(context.peer.clone()),
        ..Link::of(context.meta.clone(), context.ct.clone())
    }
}

/// The tenant the HTTP front door found for this request (`crate::http`), if any.
fn tenant(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<crate::http::Tenant>())
        .map(|t| t.0.clone())
}

fn optional<M: Default, P>(params: Option<P>) -> RequestOptionalParam<M, P> {
    match params {
        Some(params) => RequestOptionalParam::with_param(params),
        None => RequestOptionalParam {
            method: M::default(),
            params: None,
            extensions: Default::default(),
        },
    }
}

fn unexpected(method: &str) -> ErrorData {
    ErrorData::internal_error(format!("the upstream answered {method} with something else"), None)
}

/// The upstream's answer to a pass-through request, as the result type the method has.
macro_rules! answer {
    ($self:ident, $context:ident, $request:expr, $variant:ident, $method:literal) => {
        match $self.shared().upstream.request($request, &link(&$context)).await? {
            ServerResult::$variant(result) => Ok(result.complete()),
            _ => Err(unexpected($method)),
        }
    };
}

// Logging and resources/subscribe are deprecated by a newer protocol revision; clients on the older ones use them.
#[allow(deprecated)]
impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        let upstream = self.shared().upstream.info();
        ServerConfig::new(capabilities(upstream.as_ref()))
            .with_server_info(Implementation::new("once-gateway", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions(upstream.as_ref(), self.instructions()))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        // The upstream is restarted with them before it serves this client (see `crate::serve`). Over HTTP the
        // upstream is every client's: a request from it (sampling, roots, elicitation) would have no one to ask.
        if !self.is_over_http() {
            self.shared().upstream.declare(request.capabilities.clone());
        }
        self.negotiate_initialize(&request)
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let request = ClientRequest::PingRequest(RequestNoParam::default());
        self.shared()
            .upstream
            .request(request, &link(&context))
            .await
            .map(|_| ())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        answer!(
            self,
            context,
            ClientRequest::CompleteRequest(Request::new(request)),
            CompleteResult,
            "completion/complete"
        )
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let request = ClientRequest::SetLevelRequest(Request::new(request));
        self.shared()
            .upstream
            .request(request, &link(&context))
            .await
            .map(|_| ())
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let request = ClientRequest::GetPromptRequest(Request::new(request));
        match self.shared().upstream.request(request, &link(&context)).await? {
            ServerResult::GetPromptResult(result) => Ok(GetPromptResponse::Complete(result.complete())),
            ServerResult::InputRequiredResult(result) => Ok(GetPromptResponse::InputRequired(result)),
            _ => Err(unexpected("prompts/get")),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        answer!(
            self,
            context,
            ClientRequest::ListPromptsRequest(optional(request)),
            ListPromptsResult,
            "prompts/list"
        )
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        answer!(
            self,
            context,
            ClientRequest::ListResourcesRequest(optional(request)),
            ListResourcesResult,
            "resources/list"
        )
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        answer!(
            self,
            context,
            ClientRequest::ListResourceTemplatesRequest(optional(request)),
            ListResourceTemplatesResult,
            "resources/templates/list"
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let request = ClientRequest::ReadResourceRequest(Request::new(request));
        match self.shared().upstream.request(request, &link(&context)).await? {
            ServerResult::ReadResourceResult(result) => Ok(ReadResourceResponse::Complete(result.complete())),
            ServerResult::InputRequiredResult(result) => Ok(ReadResourceResponse::InputRequired(result)),
            _ => Err(unexpected("resources/read")),
        }
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let request = ClientRequest::SubscribeRequest(Request::new(request));
        self.shared()
            .upstream
            .request(request, &link(&context))
            .await
            .map(|_| ())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let request = ClientRequest::UnsubscribeRequest(Request::new(request));
        self.shared()
            .upstream
            .request(request, &link(&context))
            .await
            .map(|_| ())
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        // Where the gateway declared tasks, `crate::wire` routes these around rmcp; here it declared none.
        if crate::wire::TASK_METHODS.contains(&request.method.as_str()) {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("{}: this gateway declares no tasks here", request.method),
                None,
            ));
        }
        let version = context.protocol_version();
        let answer = match self
            .shared()
            .upstream
            .request(ClientRequest::CustomRequest(request), &link(&context))
            .await?
        {
            ServerResult::CustomResult(result) => result,
            // The upstream's answer parsed as a known shape: pass it on as the JSON it was.
            other => serde_json::to_value(other)
                .map(CustomResult)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?,
        };
        Ok(crate::shaped::custom(answer, version.as_ref()))
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        let notification = ClientNotification::RootsListChangedNotification(Default::default());
        self.shared().upstream.notify(notification).await;
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let listed: Result<ListToolsResult, ErrorData> = answer!(
            self,
            context,
            ClientRequest::ListToolsRequest(optional(request)),
            ListToolsResult,
            "tools/list"
        );
        let mut listed = listed?;
        let carried = |t: &Tool| {
            t.meta
                .as_ref()
                .is_some_and(|m| m.contains_key(crate::wire::EXECUTION_META))
        };
        if !listed.tools.iter().any(carried) {
            return Ok(listed);
        }
        if self.is_over_http() {
            for tool in &mut listed.tools {
                crate::tasks::present(tool, false, false, true);
            }
            return Ok(listed);
        }
        // A tool's route is the engine's: asked on a blocking thread, as a call asks it.
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let drives = this.shared().upstream.runs_tasks();
            for tool in &mut listed.tools {
                let direct = this.routes_direct(&tool.name);
                crate::tasks::present(tool, direct, drives, false);
            }
            listed
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("the gateway's worker failed: {e}"), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let this = self.clone();
        let meta = context.meta.0.0.clone();
        let link = link(&context);
        let tenant = tenant(&context);
        let stateless = crate::shaped::is_stateless_revision(context.protocol_version().as_ref());
        let tool = request.name.to_string();
        // Counted until the engine is done, even if the client goes away first: shutdown waits for it. A
        // task of its own, since the server drops this handler's future when the client cancels, and a sent
        // attempt must still be reported.
        let in_flight = self.shared().in_flight();
        let response = tokio::spawn(async move {
            let _in_flight = in_flight;
            this.call(request, meta, link, tenant).await
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("the gateway's worker failed: {e}"), None))??;
        let result = match response {
            CallToolResponse::Complete(result) => result,
            // A client on an older revision cannot take a question: it is told what happened instead.
            CallToolResponse::InputRequired(_) if !stateless => {
                let why = "this client's protocol revision cannot carry it";
                return Ok(crate::reply::input_not_carried(&tool, why).into());
            }
            other => return Ok(other),
        };
        // On stdio `crate::wire` hands a task handle to the client as the upstream sent it; over HTTP
        // nothing carries one (the gateway declares no tasks there, so none was asked for).
        if self.is_over_http()
            && result
                .meta
                .as_ref()
                .is_some_and(|m| m.contains_key(crate::wire::CREATED_TASK_META))
        {
            return Err(ErrorData::internal_error(
                "the upstream answered with a task, which this gateway does not carry over HTTP",
                None,
            ));
        }
        Ok(result.complete().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ProgressToken, ProtocolVersion, RequestMetaObject};
    use tokio_util::sync::CancellationToken;

    fn upstream(capabilities: serde_json::Value, instructions: Option<&str>) -> ServerPeerInfo {
        let mut info = ServerPeerInfo::new(ProtocolVersion::LATEST, serde_json::from_value(capabilities).unwrap());
        info.instructions = instructions.map(str::to_string);
        info
    }

    #[test]
    fn the_upstreams_capabilities_less_its_extensions_and_always_tools() {
        let info = upstream(
            serde_json::json!({
                "logging": {}, "completions": {}, "prompts": {"listChanged": true},
                "resources": {"subscribe": true}, "experimental": {"x": {}},
                "extensions": {"io.modelcontextprotocol/tasks": {}},
            }),
            None,
        );
        let declared = serde_json::to_value(capabilities(Some(&info))).unwrap();
        assert_eq!(
            declared,
            serde_json::json!({
                "logging": {}, "completions": {}, "prompts": {"listChanged": true},
                "resources": {"subscribe": true}, "experimental": {"x": {}}, "tools": {},
            })
        );
        assert_eq!(
            serde_json::to_value(capabilities(None)).unwrap(),
            serde_json::json!({"tools": {}})
        );
    }

    #[test]
    fn the_upstreams_instructions_come_first_and_unchanged() {
        let info = upstream(serde_json::json!({}), Some("Use the refund tool carefully."));
        assert_eq!(
            instructions(Some(&info), "once's note."),
            "Use the refund tool carefully.\n\nonce's note."
        );
        let silent = upstream(serde_json::json!({}), Some("  "));
        assert_eq!(instructions(Some(&silent), "once's note."), "once's note.");
    }

    #[test]
    fn a_link_keeps_the_clients_progress_token_apart_from_its_other_meta() {
        let mut meta = RequestMetaObject::new();
        meta.set_progress_token(ProgressToken(rmcp::model::NumberOrString::Number(7)));
        meta.insert("trace".to_string(), serde_json::json!("abc"));
        let link = Link::of(meta, CancellationToken::new());
        assert_eq!(
            link.progress,
            Some(ProgressToken(rmcp::model::NumberOrString::Number(7)))
        );
        let rest = link.meta.expect("the other _meta");
        assert_eq!(rest.get("trace"), Some(&serde_json::json!("abc")));
        assert!(rest.get("progressToken").is_none());
        assert!(
            Link::of(RequestMetaObject::new(), CancellationToken::new())
                .meta
                .is_none()
        );
    }
}
