//! The API's errors as `application/problem+json` (RFC 9457): a type, a
//! title, the status, a detail sentence, and the request field and value
//! at fault when one is.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::ops::OpsError;
use crate::ports::PortFailure;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Longest value quoted back in a problem.
const VALUE_LEN_MAX: usize = 120;

/// An error answer (RFC 9457).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type", serialize_with = "problem_type_uri")]
    #[schema(value_type = String)]
    pub kind: &'static str,
    /// The kind of problem, in a few words.
    #[schema(value_type = String)]
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, as a sentence.
    pub detail: String,
    /// The request field at fault (`name`, `parameters.size`, the
    /// `Authorization` header), when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value of that field, as given (shortened).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl Problem {
    pub fn new(status: StatusCode, slug: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind: slug,
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            value: None,
        }
    }

    /// The same problem, naming the field and value at fault.
    pub fn at(mut self, field: impl Into<String>, value: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self.value = Some(value.into().chars().take(VALUE_LEN_MAX).collect());
        self
    }

    pub fn bad_request(field: &str, value: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", detail).at(field, value)
    }

    pub fn unauthorized(detail: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail).at("Authorization", "")
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// A store or command failure, by kind: the request's fault (400),
    /// not found (404), a conflict (409, a quota included), busy or the
    /// database unavailable (503).
    pub fn from_ops(error: OpsError) -> Self {
        let (status, slug) = match &error {
            OpsError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
            OpsError::NotFound(_) => (StatusCode::NOT_FOUND, "not-found"),
            OpsError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            OpsError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            OpsError::Store(e) => match e.kind() {
                crate::ports::ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not-found"),
                crate::ports::ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
                _ => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            },
        };
        Self::new(status, slug, error.to_string())
    }
}

/// The problem type's URI, from its slug.
fn problem_type_uri<S: serde::Serializer>(slug: &&'static str, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(&format!("{PROBLEM_TYPE_BASE}{slug}"))
}

/// Where the problem types' URIs live (they name; nothing is served there).
const PROBLEM_TYPE_BASE: &str = "https://stead.invalid/problems/";

impl From<OpsError> for Problem {
    fn from(error: OpsError) -> Self {
        Self::from_ops(error)
    }
}

impl From<crate::ports::StoreError> for Problem {
    fn from(error: crate::ports::StoreError) -> Self {
        Self::from_ops(OpsError::Store(error))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"stead\""),
            );
        }
        response
    }
}
