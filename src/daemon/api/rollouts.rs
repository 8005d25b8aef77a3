//! `/v1/rollouts/{type}/halt|resume`: an operator token's switch of a
//! service type's rollout, the CLI's `stead rollout halt|resume`. A tenant
//! token is refused (403): a rollout is the fleet's, not a team's.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::problem::Problem;
use super::views::RolloutChange;
use super::{ApiState, Caller};
use crate::core::fleet::RolloutState;
use crate::ports::TokenRole;

/// Halt a service type's rollout: no upgrade of it is planned and its
/// queued upgrades are cancelled.
#[utoipa::path(
    post, path = "/v1/rollouts/{type}/halt", tag = "rollouts",
    params(("type" = String, Path, description = "The catalog's service type")),
    responses(
        (status = 200, description = "Halted", body = RolloutChange),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such service type", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn halt(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RolloutChange>, Problem> {
    switch(state, caller, path, RolloutState::Halted).await
}

/// Plan upgrades of a service type again.
#[utoipa::path(
    post, path = "/v1/rollouts/{type}/resume", tag = "rollouts",
    params(("type" = String, Path, description = "The catalog's service type")),
    responses(
        (status = 200, description = "Active again", body = RolloutChange),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an operator token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such service type", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn resume(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RolloutChange>, Problem> {
    switch(state, caller, path, RolloutState::Active).await
}

async fn switch(
    state: ApiState,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    to: RolloutState,
) -> Result<Json<RolloutChange>, Problem> {
    let Path(service_type) = path.map_err(|e| Problem::bad_request("type", "", e.body_text()))?;
    if caller.role != TokenRole::Operator {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "operator-only",
            format!(
                "token {} is team {:?}'s tenant token; a rollout's switch takes an operator token",
                caller.token_id, caller.team
            ),
        )
        .at("Authorization", ""));
    }
    let ops = state.ops(caller.scope());
    if ops.catalog.get(&service_type).is_none() {
        return Err(Problem::not_found(format!(
            "service type {service_type:?} is not in the catalog"
        ))
        .at("type", &service_type));
    }
    let reason = format!("api: token {}", caller.token_id);
    let (_before, cancelled) = ops.set_rollout(&service_type, to, &reason).await?;
    let what = format!("rollout of {service_type} set {}", to.as_str());
    state.record(&caller, None, &what).await;
    Ok(Json(RolloutChange {
        service_type,
        state: to.as_str().to_owned(),
        cancelled_tasks: cancelled,
    }))
}
