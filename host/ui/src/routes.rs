//! The HTTP routes. Every request but `/login` needs an operator's token
//! (a bearer header) or a session (the cookie `/login` sets); a
//! state-changing request is a POST that also carries the operator's CSRF
//! token, and a sign-in must come from this page, not another site. Every
//! response, a 404 or a redirect too, carries the same security headers.
//! Ledger work runs on the blocking pool: the engine and the ledger are
//! synchronous.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Form, Query, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HOST, LOCATION, ORIGIN, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use once::types::{Error, QueueFilter, Resolution};
use once::{OnceError, Stats};
use serde::Deserialize;

use crate::Ui;
use crate::access::{COOKIE_NAME, Operator};
use crate::html::{page, record_href};
use crate::pages::{self, Banner, FilterForm};
use once::metrics;

pub fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/", get(queue))
        .route("/record", get(record))
        .route("/resolve", axum::routing::post(resolve))
        .route("/metrics", get(metrics_text))
        .route("/login", get(login_link).post(login_form))
        .layer(axum::middleware::from_fn_with_state(ui.clone(), front_door))
        .with_state(ui)
        // Outermost, so axum's own answers (404 for an unknown path, 405, a rejected form) carry them too.
        .layer(axum::middleware::map_response(security_headers))
}

/// Before every route: a request with an operator's credentials, or a sign-in that opens a session, takes
/// its connection out of the cap on unauthenticated ones (so a flood of idle connections never closes an
/// operator's), and a body is read whole within the body timeout and [`crate::BODY_LIMIT`] before any
/// handler sees it.
async fn front_door(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    let connection = request.extensions().get::<once_serve::Connection>().cloned();
    let operator = signed_in(&ui, request.headers()).is_some();
    if operator && let Some(connection) = &connection {
        connection.authenticated();
    }
    let (parts, body) = request.into_parts();
    let response = match once_serve::body::read(body, crate::BODY_LIMIT, ui.body_timeout).await {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(refused) => return refused,
    };
    // A browser signs in with the token in the body: the session the answer opens is its credential.
    if !operator
        && response.extensions().get::<SessionOpened>().is_some()
        && let Some(connection) = &connection
    {
        connection.authenticated();
    }
    response
}

/// Every response: never cached, never framed, no scripts, no referrer, no sniffing.
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

/// A response that is an HTML page (its security headers are added to every response, `security_headers`).
fn html(status: StatusCode, title: &str, operator: Option<&Operator>, body: &str) -> Response {
    let mut r = (status, page(title, operator.map(|o| o.name.as_str()), body)).into_response();
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    r
}

fn unauthorized() -> Response {
    let mut r = html(StatusCode::UNAUTHORIZED, "sign in", None, &pages::login(false));
    r.headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("Bearer realm=\"once ui\""));
    r
}

/// The operator a request comes from, if its token is one.
fn signed_in(ui: &Ui, headers: &HeaderMap) -> Option<Operator> {
    ui.access.authenticate(headers).cloned()
}

/// Run ledger work off the async threads.
async fn blocking<T: Send + 'static>(
    ui: &Arc<Ui>,
    work: impl FnOnce(&Ui) -> T + Send + 'static,
) -> Result<T, Response> {
    let ui = Arc::clone(ui);
    tokio::task::spawn_blocking(move || work(&ui)).await.map_err(|e| {
        html(
            StatusCode::INTERNAL_SERVER_ERROR,
            "error",
            None,
            &pages::message(&e.to_string()),
        )
    })
}

/// The HTTP status of an engine answer: bad input 400, a refused transition 409, no record 404, else 500.
fn status_of(e: &OnceError) -> StatusCode {
    match e {
        OnceError::Json(_)
        | OnceError::Engine(Error::InvalidJson(_) | Error::InvalidRequest(_) | Error::InvalidPolicy(_)) => {
            StatusCode::BAD_REQUEST
        }
        OnceError::Engine(Error::InvalidTransition(_)) => StatusCode::CONFLICT,
        OnceError::Engine(Error::NotFound) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn failed(operator: &Operator, e: &OnceError) -> Response {
    html(status_of(e), "error", Some(operator), &pages::message(&e.to_string()))
}

fn filter_for(operator: &Operator, form: &FilterForm) -> QueueFilter {
    let set = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
    let scopes = match set(&form.scope) {
        // A scope the operator may not see matches nothing (an empty list), not everything.
        Some(scope) => Some(if operator.sees(&scope) { vec![scope] } else { Vec::new() }),
        None => operator.scopes.clone(),
    };
    QueueFilter {
        scopes,
        tool: set(&form.tool),
        key_prefix: set(&form.key),
    }
}

/// Counts of the scopes `filter` admits: the whole ledger's only for an operator who sees every scope.
fn stats_for(ui: &Ui, filter: &QueueFilter) -> Result<Stats, OnceError> {
    let Some(scopes) = &filter.scopes else {
        return ui.once.stats(None);
    };
    let mut total = Stats::default();
    for scope in scopes {
        let s = ui.once.stats(Some(scope))?;
        for (state, n) in s.by_state {
            match total.by_state.iter_mut().find(|(t, _)| *t == state) {
                Some((_, m)) => *m += n,
                None => total.by_state.push((state, n)),
            }
        }
        for (kind, n) in s.events {
            match total.events.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, m)) => *m += n,
                None => total.events.push((kind, n)),
            }
        }
    }
    Ok(total)
}

async fn queue(State(ui): State<Arc<Ui>>, headers: HeaderMap, Query(form): Query<FilterForm>) -> Response {
    let Some(operator) = signed_in(&ui, &headers) else {
        return unauthorized();
    };
    let filter = filter_for(&operator, &form);
    let read = blocking(&ui, move |ui| {
        let queue = ui.once.queue(&filter, ui.limit)?;
        let stats = stats_for(ui, &filter)?;
        Ok::<_, OnceError>((queue, stats, ui.limit))
    })
    .await;
    match read {
        Ok(Ok((queue, stats, limit))) => html(
            StatusCode::OK,
            "what needs a person",
            Some(&operator),
            &pages::queue(&queue, &stats, &form, limit),
        ),
        Ok(Err(e)) => failed(&operator, &e),
        Err(r) => r,
    }
}

// Every field defaults, so a request without a token is answered 401, not a decoding error.
#[derive(Deserialize)]
struct RecordQuery {
    #[serde(default)]
    scope: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    resolved: Option<String>,
}

async fn record(State(ui): State<Arc<Ui>>, headers: HeaderMap, Query(q): Query<RecordQuery>) -> Response {
    let Some(operator) = signed_in(&ui, &headers) else {
        return unauthorized();
    };
    let banner = q.resolved.map(|_| Shown::Resolved);
    render_record(&ui, &operator, q.scope, q.key, StatusCode::OK, banner).await
}

/// What a record's page says above the record.
enum Shown {
    /// A resolution was applied: the state shown is read back from the ledger.
    Resolved,
    /// A resolution was refused, for this reason.
    Refused(String),
}

/// A record's page, with `banner` above it.
async fn render_record(
    ui: &Arc<Ui>,
    operator: &Operator,
    scope: String,
    key: String,
    status: StatusCode,
    banner: Option<Shown>,
) -> Response {
    let not_found = format!("no record for key {key:?} in scope {scope:?}");
    // Another scope's record does not exist for this operator: the same answer as a missing one.
    if !operator.sees(&scope) {
        return html(
            StatusCode::NOT_FOUND,
            "not found",
            Some(operator),
            &pages::message(&not_found),
        );
    }
    let view = match blocking(ui, move |ui| ui.once.inspect(&scope, &key)).await {
        Ok(Ok(Some(view))) => view,
        Ok(Ok(None)) => {
            return html(
                StatusCode::NOT_FOUND,
                "not found",
                Some(operator),
                &pages::message(&not_found),
            );
        }
        Ok(Err(e)) => return failed(operator, &e),
        Err(r) => return r,
    };
    let banner = banner.map(|shown| match shown {
        Shown::Refused(why) => Banner::Refused(why),
        Shown::Resolved => Banner::Resolved(view.state),
    });
    let title = format!("{} · {}", view.scope, view.key);
    html(
        status,
        &title,
        Some(operator),
        &pages::record(&view, &ui.access.csrf_token(operator), banner.as_ref()),
    )
}

#[derive(Deserialize)]
struct ResolveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    resolution: String,
    #[serde(default)]
    receipt: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    force: Option<String>,
}

async fn resolve(State(ui): State<Arc<Ui>>, headers: HeaderMap, Form(form): Form<ResolveForm>) -> Response {
    let Some(operator) = signed_in(&ui, &headers) else {
        return unauthorized();
    };
    if !ui.access.csrf_ok(&operator, &form.csrf) {
        return html(
            StatusCode::FORBIDDEN,
            "refused",
            Some(&operator),
            &pages::message(
                "This form's CSRF token is missing or stale: nothing was resolved. Reload the record and try again.",
            ),
        );
    }
    let refuse = |why: &str| Some(Shown::Refused(why.to_string()));
    let resolution = match form.resolution.as_str() {
        "confirmed" => Resolution::Confirmed(form.receipt.clone()),
        "absent" => Resolution::Absent,
        "approve" => Resolution::Approve,
        "deny" => Resolution::Deny,
        _ => {
            let why = refuse("choose confirmed (with its receipt), absent, approve or deny");
            return render_record(&ui, &operator, form.scope, form.key, StatusCode::BAD_REQUEST, why).await;
        }
    };
    if form.note.trim().is_empty() {
        let why = refuse("a resolution needs a note: why you know what happened");
        return render_record(&ui, &operator, form.scope, form.key, StatusCode::BAD_REQUEST, why).await;
    }
    if !operator.sees(&form.scope) {
        return render_record(&ui, &operator, form.scope, form.key, StatusCode::NOT_FOUND, None).await;
    }
    // Who and why, in the engine's audit event for the resolution.
    let note = format!("{} (once ui): {}", operator.name, form.note.trim());
    let force = form.force.is_some();
    let (scope, key) = (form.scope.clone(), form.key.clone());
    let done = blocking(&ui, move |ui| ui.once.resolve(&scope, &key, &resolution, &note, force)).await;
    match done {
        Ok(Ok(_)) => {
            let to = format!("{}&resolved=1", record_href(&form.scope, &form.key));
            let mut r = StatusCode::SEE_OTHER.into_response();
            if let Ok(v) = HeaderValue::from_str(&to) {
                r.headers_mut().insert(LOCATION, v);
            }
            r
        }
        Ok(Err(e)) => {
            let why = Some(Shown::Refused(e.to_string()));
            render_record(&ui, &operator, form.scope, form.key, status_of(&e), why).await
        }
        Err(r) => r,
    }
}

async fn metrics_text(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    let Some(operator) = signed_in(&ui, &headers) else {
        return unauthorized();
    };
    let filter = filter_for(&operator, &FilterForm::default());
    let read = blocking(&ui, move |ui| {
        let queue = ui.once.queue(&filter, ui.limit)?;
        let stats = stats_for(ui, &filter)?;
        Ok::<_, OnceError>(metrics::render(&stats, &queue))
    })
    .await;
    match read {
        Ok(Ok(text)) => ([(CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Err(r) => r,
    }
}

#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    token: Option<String>,
}

async fn login_link(State(ui): State<Arc<Ui>>, headers: HeaderMap, Query(q): Query<TokenForm>) -> Response {
    match q.token {
        // Kept for links written before sign-in moved to the form: the token leaves the address bar at once
        // (a redirect to `/`), and only as a sign-in this page or the address bar started.
        Some(token) => sign_in(&ui, &headers, &token),
        None => html(StatusCode::OK, "sign in", None, &pages::login(false)),
    }
}

async fn login_form(State(ui): State<Arc<Ui>>, headers: HeaderMap, Form(f): Form<TokenForm>) -> Response {
    sign_in(&ui, &headers, f.token.as_deref().unwrap_or(""))
}

/// Whether a sign-in was started by this page itself or by no page (an address typed or pasted, a script),
/// not by another site (login CSRF: a foreign page signing the browser in as someone else). Browsers say so
/// in `Sec-Fetch-Site`, and older ones in `Origin` (sent with every POST); a client that sends neither is
/// not a browser another site could drive.
fn from_this_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return true;
    };
    // `Origin: scheme://host[:port]` against this request's `Host` (a proxy in front must pass `Host` on).
    let authority = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, a)| a);
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    authority.is_some() && authority == host
}

/// A valid token opens a session: the cookie holds its random id (HttpOnly, SameSite=Strict, Secure behind
/// TLS), never the token, and the browser is sent to `/`.
fn sign_in(ui: &Ui, headers: &HeaderMap, token: &str) -> Response {
    if !from_this_site(headers) {
        return html(
            StatusCode::FORBIDDEN,
            "refused",
            None,
            &pages::message(
                "A sign-in started by another site was refused. Open this page's own address and sign in there.",
            ),
        );
    }
    let Some(operator) = ui.access.by_token(token.trim()) else {
        return html(StatusCode::UNAUTHORIZED, "sign in", None, &pages::login(true));
    };
    let id = match ui.access.open_session(operator) {
        Ok(id) => id,
        Err(e) => {
            return html(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                None,
                &pages::message(&format!("no session could be opened: {e}")),
            );
        }
    };
    let mut r = StatusCode::SEE_OTHER.into_response();
    let secure = if ui.secure_cookie { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE_NAME}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
        ui.access.lifetime().as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(SET_COOKIE, v);
        r.extensions_mut().insert(SessionOpened);
    }
    r.headers_mut().insert(LOCATION, HeaderValue::from_static("/"));
    r
}

/// Marks the answer to a sign-in that opened a session (`front_door` takes its connection out of the cap).
#[derive(Debug, Clone, Copy)]
struct SessionOpened;
