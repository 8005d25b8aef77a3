//! `/v1/instances`: each handler runs the CLI's command ([`Ops`]) scoped to
//! the caller's team, so another team's instance is not found (404, never
//! 403), and records the change as an event naming token and team.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::IntoParams;

use super::idempotency::{fingerprint, valid_key, Used};
use super::problem::Problem;
use super::views::{
    Change, CreateInstance, EventView, InstanceDetail, InstancePage, InstanceView, ServiceView,
};
use super::{ApiState, Caller};
use crate::core::event_log::EventFilter;
use crate::core::fleet::Instance;
use crate::core::types::InstanceName;
use crate::ops::{CreateRequest, Deletion, Ops, OpsError, Retry, TTL_CLI_MIN, TTL_MAX};

/// Instances per page unless `limit` says otherwise, and the most.
const PAGE_DEFAULT: u32 = 50;
const PAGE_MAX: u32 = 500;
/// Events `GET /v1/instances/{name}` shows.
const EVENTS_SHOWN: u32 = 20;
/// The request header that makes a create idempotent.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl ApiState {
    fn view(&self, ops: &Ops<'_>, instance: &Instance) -> InstanceView {
        let urls = self
            .served
            .urls(instance, ops.catalog.get(&instance.service_type));
        InstanceView::new(instance, urls)
    }
}

/// The instance name of a path, or a 404 naming it.
pub(super) fn instance_name(path: Result<Path<String>, PathRejection>) -> Result<String, Problem> {
    let Path(name) = path.map_err(|e| Problem::bad_request("name", "", e.body_text()))?;
    crate::ops::check_instance_name(&name)
        .map_err(|_| Problem::not_found(format!("no instance named {name:?}")).at("name", &name))?;
    Ok(name)
}

/// The field of a create's body an [`OpsError::Invalid`] is about, by the
/// flag the CLI's message names.
fn create_field(message: &str) -> &'static str {
    const FIELDS: [(&str, &str); 7] = [
        ("--set", "parameters"),
        ("--domain", "domains"),
        ("--window", "maintenance_window"),
        ("ttl", "ttl_s"),
        ("service type", "type"),
        ("--version", "type"),
        ("team", "Authorization"),
    ];
    FIELDS
        .iter()
        .find(|(prefix, _)| message.starts_with(prefix))
        .map_or("name", |(_, field)| field)
}

/// A JSON body as `T`, or a 400 naming the field that is wrong.
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let message = e.inner().to_string();
        // A missing field is reported at its object; name the field itself.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = missing.map_or_else(|| e.path().to_string(), str::to_owned);
        Problem::bad_request(&field, "", format!("the body at {field}: {message}"))
    })
}

fn parse_create(body: &[u8]) -> Result<CreateInstance, Problem> {
    let create: CreateInstance = parse_body(body)?;
    if let Some(ttl) = create.ttl_s {
        if !(TTL_CLI_MIN.as_secs()..=TTL_MAX.as_secs()).contains(&ttl) {
            return Err(Problem::bad_request(
                "ttl_s",
                &ttl.to_string(),
                format!(
                    "ttl_s {ttl}: must be between {} and {} seconds",
                    TTL_CLI_MIN.as_secs(),
                    TTL_MAX.as_secs()
                ),
            ));
        }
    }
    Ok(create)
}

/// Create an instance of a catalog type for the token's team.
#[utoipa::path(
    post, path = "/v1/instances", tag = "instances",
    request_body = CreateInstance,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Sent again with the same key, the create answers the same instance")),
    responses(
        (status = 201, description = "Created; its provisioning is queued", body = InstanceView),
        (status = 200, description = "Made before by this Idempotency-Key", body = InstanceView),
        (status = 400, description = "A field is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The name is taken, or a quota is reached", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used with another body", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body.map_err(|e| {
        let status = e.status();
        Problem::new(status, "body", e.body_text()).at("body", "")
    })?;
    let key = match headers.get(IDEMPOTENCY_KEY) {
        None => None,
        Some(value) => match value.to_str().ok().filter(|k| valid_key(k)) {
            Some(key) => Some(key.to_owned()),
            None => {
                return Err(Problem::bad_request(
                    "Idempotency-Key",
                    &String::from_utf8_lossy(value.as_bytes()),
                    "must be 1 to 255 visible ASCII characters",
                ))
            }
        },
    };
    let fingerprint = fingerprint(&body);
    let ops = state.ops(caller.scope());
    if let Some(key) = &key {
        if let Some(used) = state.idempotency.lookup(caller.token_id, key) {
            return replay(&state, &ops, key, &used, fingerprint).await;
        }
    }
    let request = parse_create(&body)?;
    let name = request.name.clone();
    let value_of = {
        let request = request.clone();
        move |field: &str| match field {
            "type" => request.service_type.clone(),
            "ttl_s" => request.ttl_s.map(|t| t.to_string()).unwrap_or_default(),
            "maintenance_window" => request.maintenance_window.clone().unwrap_or_default(),
            "parameters" => serde_json::to_string(&request.parameters).unwrap_or_default(),
            "domains" => request.domains.join(", "),
            "Authorization" => String::new(),
            _ => request.name.clone(),
        }
    };
    let create = CreateRequest {
        name: request.name,
        service_type: request.service_type,
        team: caller.team.clone(),
        version: None,
        ttl: request.ttl_s.map(Duration::from_secs),
        maintenance_window: request.maintenance_window,
        exists_ok: key.is_some(),
        parameters: request.parameters,
        domains: request.domains,
    };
    let created = ops.create(&create).await.map_err(|e| match e {
        OpsError::Invalid(message) => {
            let field = create_field(&message);
            Problem::from_ops(OpsError::Invalid(message)).at(field, value_of(field))
        }
        OpsError::Conflict(message) if message.starts_with("--domain") => {
            Problem::from_ops(OpsError::Conflict(message)).at("domains", value_of("domains"))
        }
        other => Problem::from_ops(other).at("name", &name),
    })?;
    if let Some(key) = &key {
        let instance = name.clone();
        let used = Used {
            fingerprint,
            instance,
        };
        state.idempotency.remember(caller.token_id, key, used);
    }
    let status = if created.task.is_some() {
        let what = format!("created {} ({})", name, created.instance.service_type);
        state
            .record(&caller, Some(&created.instance.name), &what)
            .await;
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut response = (status, Json(state.view(&ops, &created.instance))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/instances/{name}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// A create sent again with a key already used.
async fn replay(
    state: &ApiState,
    ops: &Ops<'_>,
    key: &str,
    used: &Used,
    fingerprint: u64,
) -> Result<Response, Problem> {
    if used.fingerprint != fingerprint {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            format!(
                "Idempotency-Key {key:?} was used for another request (instance {}); use a new key",
                used.instance
            ),
        )
        .at("Idempotency-Key", key));
    }
    let instance = ops.find(&used.instance).await?;
    Ok((StatusCode::OK, Json(state.view(ops, &instance))).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many instances (1 to 500; 50 when absent).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9]{1,18}$")]
    cursor: Option<String>,
    /// Operator tokens: only this team's instances.
    team: Option<String>,
    /// Include deleted instances.
    all: Option<bool>,
}

/// The token's team's instances (an operator's: the fleet's), in creation
/// order, a page at a time.
#[utoipa::path(
    get, path = "/v1/instances", tag = "instances",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of instances", body = InstancePage),
        (status = 400, description = "A parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<InstancePage>, Problem> {
    let Query(query) = query.map_err(|e| Problem::bad_request("query", "", e.body_text()))?;
    let limit = query.limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(Problem::bad_request(
            "limit",
            &limit.to_string(),
            format!("limit {limit}: must be between 1 and {PAGE_MAX}"),
        ));
    }
    let after: i64 = match &query.cursor {
        None => 0,
        Some(cursor) => cursor.parse().map_err(|_| {
            Problem::bad_request("cursor", cursor, "cursor: not a next_cursor this API gave")
        })?,
    };
    let ops = state.ops(caller.scope());
    let instances: Vec<Instance> = ops
        .list(query.all.unwrap_or(false))
        .await?
        .into_iter()
        .filter(|i| i.id > after)
        .filter(|i| query.team.as_ref().is_none_or(|team| &i.team == team))
        .take(limit as usize + 1)
        .collect();
    let more = instances.len() > limit as usize;
    let page: Vec<&Instance> = instances.iter().take(limit as usize).collect();
    Ok(Json(InstancePage {
        next_cursor: more
            .then(|| page.last().map(|i| i.id.to_string()))
            .flatten(),
        instances: page.iter().map(|i| state.view(&ops, i)).collect(),
    }))
}

/// One instance: its state, services, URLs and recent events.
#[utoipa::path(
    get, path = "/v1/instances/{name}", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    responses(
        (status = 200, description = "The instance", body = InstanceDetail),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<InstanceDetail>, Problem> {
    let name = instance_name(path)?;
    let ops = state.ops(caller.scope());
    let instance = ops.find(&name).await?;
    let active = state.store.load_active(&instance.name).await?;
    let mut services: Vec<ServiceView> = ops
        .catalog
        .get(&instance.service_type)
        .map(|entry| {
            entry
                .services
                .iter()
                .map(|s| ServiceView {
                    name: s.name.to_string(),
                    container: active
                        .services
                        .get(&s.name)
                        .map(|a| a.container.to_string()),
                })
                .collect()
        })
        .unwrap_or_default();
    for (service, serving) in &active.services {
        if !services.iter().any(|s| s.name == service.as_str()) {
            services.push(ServiceView {
                name: service.to_string(),
                container: Some(serving.container.to_string()),
            });
        }
    }
    let filter = EventFilter {
        instance: Some(InstanceName::new(&name)),
        limit: EVENTS_SHOWN,
        ..EventFilter::default()
    };
    let events = state.store.events(&filter).await?;
    Ok(Json(InstanceDetail {
        instance: state.view(&ops, &instance),
        services,
        events: events.rows.iter().map(EventView::from).collect(),
    }))
}

/// What a change's answer says: the instance as it is now.
pub(super) async fn changed(
    state: &ApiState,
    ops: &Ops<'_>,
    caller: &Caller,
    name: &str,
    message: String,
) -> Result<Json<Change>, Problem> {
    let instance = ops.find(name).await?;
    state.record(caller, Some(&instance.name), &message).await;
    Ok(Json(Change {
        instance: state.view(ops, &instance),
        message,
    }))
}

/// Stop an instance: its containers are stopped and unpublished, kept.
#[utoipa::path(
    post, path = "/v1/instances/{name}/stop", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    responses(
        (status = 200, description = "Its intent is stopped", body = Change),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is being deleted", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn stop(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Change>, Problem> {
    set_stopped(state, caller, path, true).await
}

/// Start an instance again: its intent is running.
#[utoipa::path(
    post, path = "/v1/instances/{name}/start", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    responses(
        (status = 200, description = "Its intent is running", body = Change),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is being deleted", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn start(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Change>, Problem> {
    set_stopped(state, caller, path, false).await
}

async fn set_stopped(
    state: ApiState,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    stopped: bool,
) -> Result<Json<Change>, Problem> {
    let name = instance_name(path)?;
    let ops = state.ops(caller.scope());
    let changed_now = ops.set_stopped(&name, stopped).await?;
    let verb = if stopped { "stopped" } else { "started" };
    let message = if changed_now {
        format!("{verb} {name}")
    } else {
        format!("{name} was already {verb}; nothing changed")
    };
    changed(&state, &ops, &caller, &name, message).await
}

/// Provision a failed instance again, or reprovision a ready one.
#[utoipa::path(
    post, path = "/v1/instances/{name}/retry", tag = "instances",
    params(("name" = String, Path, description = "The instance's name")),
    responses(
        (status = 200, description = "Its task is queued (or was)", body = Change),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Its state allows no retry", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn retry(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Change>, Problem> {
    let name = instance_name(path)?;
    let ops = state.ops(caller.scope());
    let message = match ops.retry(&name).await? {
        Retry::Provisioning { task } => {
            format!("provisioning of {name} queued again (task {task})")
        }
        Retry::Reprovisioning { task } => format!("reprovisioning of {name} queued (task {task})"),
        Retry::AlreadyQueued { kind } => format!("a {kind} of {name} is already queued"),
    };
    changed(&state, &ops, &caller, &name, message).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Remove its named volumes too (its data is lost for good); kept
    /// when absent, as `instance delete` without `--purge-volumes`.
    purge_volumes: Option<bool>,
}

/// Delete an instance: its deprovisioning is queued; its named volumes
/// are kept unless `purge_volumes=true`.
#[utoipa::path(
    delete, path = "/v1/instances/{name}", tag = "instances",
    params(("name" = String, Path, description = "The instance's name"), DeleteQuery),
    responses(
        (status = 202, description = "Its deletion is queued (or was)", body = Change),
        (status = 400, description = "The path is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No live token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such instance in the token's team", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It cannot be deleted now", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the token's rate", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database or the instance is busy", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn delete(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Change>), Problem> {
    let name = instance_name(path)?;
    let Query(query) = query.map_err(|e| Problem::bad_request("query", "", e.body_text()))?;
    let purge = query.purge_volumes.unwrap_or(false);
    let ops = state.ops(caller.scope());
    let message = match ops.delete(&name, purge).await? {
        Deletion::Started { task, .. } if purge => {
            format!("deletion of {name} queued (task {task}); its named volumes go with it")
        }
        Deletion::Started { task, .. } => format!("deletion of {name} queued (task {task})"),
        Deletion::AlreadyDeleting => format!("{name} is already being deleted"),
        Deletion::AlreadyDeleted => format!("{name} is already deleted"),
    };
    let change = changed(&state, &ops, &caller, &name, message).await?;
    Ok((StatusCode::ACCEPTED, change))
}
