//! `/v1/instances/{name}/inhibit|release`: a hold on one service, so the
//! recovery pass leaves its container alone (R6), and its release; the
//! CLI's `instance inhibit` and `instance release`, scoped like every
//! instance command to the token's team.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;

use super::instances::{changed, instance_name, parse_body};
use super::problem::Problem;
use super::views::Change;
use super::{ApiState, Caller};
use crate::ops::{OpsError, OPERATOR_HOLD};

/// Longest reason a hold may give.
const REASON_LEN_MAX: usize = 200;

/// A body's `service`: a service name (a DNS label), or a 400 naming it,
/// as the schema says; never looked up when it cannot be one.
fn service_name(service: &str) -> Result<(), Problem> {
    crate::core::names::check_dns_label("service", service)
        .map_err(|e| Problem::bad_request("service", service, e.to_string()))
}

/// `POST /v1/instances/{name}/inhibit`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// The service to hold, one of the instance's active services.
    #[schema(min_length = 1, max_length = 63)]
    pub service: String,
    /// Why, as `stead instance why` and the events say it; `operator-hold`
    /// when absent.
    #[schema(min_length = 1, max_length = 200)]
    pub reason: Option<String>,
}

/// `POST /v1/instances/{name}/release`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// The service whose holds are released.
    #[schema(min_length = 1, max_length = 63)]
    pub service: String,
}

/// Hold a service: recovery leaves its container as it is (R6) until the
/// hold is released.
#[utoipa::path(
    post, path = "/v1/instances/{name}/inhibit", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    request_body = Hold,
    responses(
        (status = 200, description = "The service is held", body = Change),
        (status = 400, description = "The path or the body is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team, or no such active service", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is being deleted", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn inhibit(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Json<Change>, Problem> {
    let name = instance_name(path)?;
    let hold: Hold = parse_body(&body)?;
    service_name(&hold.service)?;
    let reason = hold.reason.as_deref().unwrap_or(OPERATOR_HOLD);
    if reason.is_empty() || reason.chars().count() > REASON_LEN_MAX {
        return Err(Problem::bad_request(
            "reason",
            reason,
            format!("reason: 1 to {REASON_LEN_MAX} characters"),
        ));
    }
    let ops = state.ops(caller.scope());
    let container = ops
        .inhibit(&name, &hold.service, reason)
        .await
        .map_err(|e| match e {
            OpsError::NotFound(message) if message.contains("has no active service") => {
                Problem::from_ops(OpsError::NotFound(message)).at("service", &hold.service)
            }
            other => Problem::from_ops(other).at("name", &name),
        })?;
    let message = format!(
        "{name}/{}: held ({reason}) on container {container}; recovery leaves it alone until \
         released",
        hold.service
    );
    changed(&state, &ops, &caller, &name, message).await
}

/// Release every hold on a service (an upgrade's retirement markers stay).
#[utoipa::path(
    post, path = "/v1/instances/{name}/release", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    request_body = Release,
    responses(
        (status = 200, description = "Its holds are released (or there were none)", body = Change),
        (status = 400, description = "The path or the body is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn release(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Result<Json<Change>, Problem> {
    let name = instance_name(path)?;
    let release: Release = parse_body(&body)?;
    service_name(&release.service)?;
    let ops = state.ops(caller.scope());
    let released = ops.release(&name, &release.service).await?;
    let message = match released {
        0 => format!(
            "{name}/{}: no hold to release; nothing changed",
            release.service
        ),
        n => format!("{name}/{}: released {n} hold(s)", release.service),
    };
    changed(&state, &ops, &caller, &name, message).await
}
