//! A request body read whole within a deadline and a size limit: a client
//! that sends its body slowly (or never finishes it) is answered 408 and the
//! connection closed, one that sends too much 413, rather than holding a task
//! and its buffer for as long as it likes.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use hyper::body::Body as _;

/// The body, or the response that refuses the request: 408 when it did not arrive within `timeout`, 413
/// when it exceeds `limit` bytes (both with `Connection: close`: the rest is not waited for), 400 when
/// reading it failed.
pub async fn read(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, Response> {
    match tokio::time::timeout(timeout, collect(body, limit)).await {
        Ok(read) => read,
        Err(_) => {
            tracing::info!(target: "once::serve", "request refused: its body did not arrive within {timeout:?}");
            Err((
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                format!("Request Timeout: the request body did not arrive within {timeout:?}\n"),
            )
                .into_response())
        }
    }
}

/// 413, in the words rmcp's own server answered with before the gateway read bodies itself.
fn too_large(limit: usize) -> Response {
    tracing::info!(target: "once::serve", "request refused: its body exceeds {limit} bytes");
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        [(header::CONNECTION, "close")],
        format!("Payload Too Large: request body exceeds {limit} bytes"),
    )
        .into_response()
}

async fn collect(mut body: Body, limit: usize) -> Result<Bytes, Response> {
    // A declared length past the limit is refused before a byte is read (nor is `100 Continue` sent for it).
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    let mut collected = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("Bad Request: reading the request body failed: {e}\n"),
            )
                .into_response()
        })?;
        if let Ok(data) = frame.into_data() {
            if data.len() > limit.saturating_sub(collected.len()) {
                return Err(too_large(limit));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(collected))
}
