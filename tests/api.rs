//! The tenant API (#54) end to end over real TCP: the real axum router
//! and listener (`stead::daemon::api::serve`), a real SQLite store (the
//! quota race runs on Postgres too), tokens made by the CLI's command.
#![cfg(all(feature = "io", not(madsim)))]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use stead::config::daemon::ApiSettings;
use stead::core::catalog::Catalog;
use stead::core::event_log::{EventFilter, EventKind};
use stead::core::grants::Grants;
use stead::daemon::api::{self, ApiParts, ApiState};
use stead::engine::{SharedCatalog, SystemClock};
use stead::ops::{Ops, TokenRequest};
use stead::ports::{Clock, Store, TeamQuota, TokenRole};
use support::TestStore;

const CATALOG: &str = "[types.web]\nversion = \"1\"\n\
    [[types.web.services]]\nname = \"http\"\nimage = \"i\"\ntenant_domains = true\n\
    [types.db]\nversion = \"1\"\n[[types.db.services]]\nname = \"pg\"\nimage = \"p\"\n";

/// A served API and what the tests reach behind it.
struct Api {
    base: String,
    addr: SocketAddr,
    client: Client,
    store: TestStore,
    _stop: tokio::sync::watch::Sender<bool>,
}

struct Options {
    teams: BTreeMap<String, TeamQuota>,
    requests_per_minute: u32,
    max_connections: usize,
    idle_timeout: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            teams: BTreeMap::new(),
            requests_per_minute: 100_000,
            max_connections: 64,
            idle_timeout: std::time::Duration::from_secs(60),
        }
    }
}

async fn serve(store: TestStore, options: Options) -> Api {
    let catalog = Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap();
    let settings = ApiSettings {
        requests_per_minute: options.requests_per_minute,
        max_connections: options.max_connections,
        idle_timeout: options.idle_timeout,
        ..ApiSettings::default()
    };
    let state = ApiState::new(ApiParts {
        store: store.store.clone(),
        catalog: SharedCatalog::new(Arc::new(catalog)),
        clock: Arc::new(SystemClock),
        settings,
        teams: options.teams,
        memory_bytes_default: 256 * 1024 * 1024,
        served: api::views::Served {
            host_suffix: "localhost".into(),
            port: Some(8080),
        },
    });
    let listener = api::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(api::serve(state, listener, stopped));
    Api {
        base: format!("http://{addr}"),
        addr,
        client: Client::new(),
        store,
        _stop: stop,
    }
}

impl Api {
    fn store(&self) -> &dyn Store {
        self.store.store.as_ref()
    }

    /// A new token of `team` with `role`, as `stead token create` makes it.
    async fn token(&self, team: &str, role: TokenRole) -> String {
        let ops = Ops::new(self.store(), Arc::default(), SystemClock.now(), 7);
        let request = TokenRequest {
            team: team.into(),
            role,
            expires_in: None,
            label: "test".into(),
        };
        ops.create_token(&request).await.unwrap().1
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, String, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        answer(request.send().await.unwrap()).await
    }

    async fn create(&self, token: &str, name: &str) -> (StatusCode, String, Value) {
        let body = json!({"name": name, "type": "web"});
        self.call(Method::POST, "/v1/instances", token, Some(body))
            .await
    }
}

/// Status, content type and JSON body of a response.
async fn answer(response: reqwest::Response) -> (StatusCode, String, Value) {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, content_type, body)
}

fn names(page: &Value) -> Vec<&str> {
    page["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_created_read_listed_by_cursor_stopped_started_and_deleted() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let (status, _, created) = api.create(&a, "shop").await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (created["team"].as_str(), created["state"].as_str()),
        (Some("team-a"), Some("provisioning"))
    );
    assert_eq!(created["urls"][0], "http://http.shop.localhost:8080/");
    for name in ["blog", "wiki"] {
        assert_eq!(api.create(&a, name).await.0, StatusCode::CREATED);
    }
    let (status, _, detail) = api.call(Method::GET, "/v1/instances/shop", &a, None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["services"][0]["name"], "http");
    let events = detail["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["kind"] == "api"), "{detail}");

    let (_, _, first) = api
        .call(Method::GET, "/v1/instances?limit=2", &a, None)
        .await;
    assert_eq!(names(&first), ["shop", "blog"]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let path = format!("/v1/instances?limit=2&cursor={cursor}");
    let (_, _, second) = api.call(Method::GET, &path, &a, None).await;
    assert_eq!(names(&second), ["wiki"]);
    assert!(second["next_cursor"].is_null(), "{second}");

    let (status, _, stopped) = api
        .call(Method::POST, "/v1/instances/shop/stop", &a, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    assert_eq!(stopped["instance"]["stopped"], true);
    let (_, _, again) = api
        .call(Method::POST, "/v1/instances/shop/stop", &a, None)
        .await;
    assert!(again["message"]
        .as_str()
        .unwrap()
        .contains("nothing changed"));
    let (_, _, started) = api
        .call(Method::POST, "/v1/instances/shop/start", &a, None)
        .await;
    assert_eq!(started["instance"]["stopped"], false);

    let (status, _, deleted) = api
        .call(Method::DELETE, "/v1/instances/shop", &a, None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{deleted}");
    assert_eq!(deleted["instance"]["state"], "deleting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_teams_instance_is_not_found_for_get_stop_and_delete() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let b = api.token("team-b", TokenRole::Tenant).await;
    assert_eq!(api.create(&a, "shop").await.0, StatusCode::CREATED);
    for (method, path) in [
        (Method::GET, "/v1/instances/shop"),
        (Method::POST, "/v1/instances/shop/stop"),
        (Method::POST, "/v1/instances/shop/retry"),
        (Method::DELETE, "/v1/instances/shop"),
    ] {
        let (status, content_type, body) = api.call(method.clone(), path, &b, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        assert_eq!(content_type, "application/problem+json");
    }
    let (_, _, listed) = api.call(Method::GET, "/v1/instances", &b, None).await;
    assert!(names(&listed).is_empty(), "{listed}");
    // Nothing team b asked for happened to team a's instance.
    let (_, _, detail) = api.call(Method::GET, "/v1/instances/shop", &a, None).await;
    assert_eq!(
        (&detail["instance"]["state"], &detail["instance"]["stopped"]),
        (&json!("provisioning"), &json!(false))
    );
    // A name taken by another team is a conflict that says no more.
    let (status, _, taken) = api.create(&b, "shop").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        !taken["detail"].as_str().unwrap().contains("team-a"),
        "{taken}"
    );
    // An operator sees the fleet.
    let operator = api.token("ops", TokenRole::Operator).await;
    let (status, _, _) = api
        .call(Method::GET, "/v1/instances/shop", &operator, None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_token_halts_and_resumes_a_type_and_a_tenant_token_cannot() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let operator = api.token("ops", TokenRole::Operator).await;
    let tenant = api.token("team-a", TokenRole::Tenant).await;
    let (status, _, body) = api
        .call(Method::POST, "/v1/rollouts/web/halt", &tenant, None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(api.store().rollouts().await.unwrap().is_empty());
    let (status, _, halted) = api
        .call(Method::POST, "/v1/rollouts/web/halt", &operator, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{halted}");
    assert_eq!(halted["state"], "halted");
    let rollouts = api.store().rollouts().await.unwrap();
    assert_eq!(rollouts["web"], stead::core::fleet::RolloutState::Halted);
    let (_, _, resumed) = api
        .call(Method::POST, "/v1/rollouts/web/resume", &operator, None)
        .await;
    assert_eq!(resumed["state"], "active");
    let (status, _, unknown) = api
        .call(Method::POST, "/v1/rollouts/nope/halt", &operator, None)
        .await;
    assert_eq!(
        (status, &unknown["field"]),
        (StatusCode::NOT_FOUND, &json!("type"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problems_are_problem_json_naming_the_field_and_value() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let cases = [
        (
            json!({"name": "Bad_Name", "type": "web"}),
            "name",
            "Bad_Name",
        ),
        (json!({"name": "shop", "type": "nope"}), "type", "nope"),
        (
            json!({"name": "shop", "type": "web", "ttl_s": 5}),
            "ttl_s",
            "5",
        ),
        (json!({"name": "shop"}), "type", ""),
        (
            json!({"name": "shop", "type": "web", "colour": 1}),
            "colour",
            "",
        ),
        (
            json!({"name": "shop", "type": "web", "parameters": {"size": "9"}}),
            "parameters",
            "{\"size\":\"9\"}",
        ),
        (json!({"name": 7, "type": "web"}), "name", ""),
    ];
    for (body, field, value) in cases {
        let (status, content_type, problem) = api
            .call(Method::POST, "/v1/instances", &a, Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(problem["field"], field, "{body}: {problem}");
        assert_eq!(problem["value"], value, "{body}: {problem}");
        assert_eq!(problem["status"], 400);
        assert!(problem["type"].as_str().unwrap().starts_with("https://"));
        assert!(!problem["title"].as_str().unwrap().is_empty());
        assert!(!problem["detail"].as_str().unwrap().is_empty());
    }
    let huge = json!({"name": "shop", "type": "web", "maintenance_window": "x".repeat(70_000)});
    let (status, content_type, problem) = api
        .call(Method::POST, "/v1/instances", &a, Some(huge))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    let (_, _, missing) = api
        .call(
            Method::POST,
            "/v1/instances",
            &a,
            Some(json!({"name": "x"})),
        )
        .await;
    assert!(
        missing["detail"].as_str().unwrap().contains("type"),
        "{missing}"
    );
}

#[tokio::test]
async fn a_hold_names_a_service_by_its_name_or_is_refused_naming_the_field() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    assert_eq!(api.create(&a, "shop").await.0, StatusCode::CREATED);
    let long = "s".repeat(64);
    for (path, body, field) in [
        (
            "/v1/instances/shop/release",
            json!({"service": long}),
            "service",
        ),
        (
            "/v1/instances/shop/inhibit",
            json!({"service": "Bad Name"}),
            "service",
        ),
        (
            "/v1/instances/shop/inhibit",
            json!({"service": "http", "reason": "r".repeat(201)}),
            "reason",
        ),
    ] {
        let (status, _, problem) = api.call(Method::POST, path, &a, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {problem}");
        assert_eq!(problem["field"], field, "{path}: {problem}");
    }
}

#[tokio::test]
async fn a_tenant_gives_host_names_within_its_teams_domains_only() {
    let team_a = TeamQuota {
        domain_suffixes: vec!["a.example".into()],
        ..TeamQuota::default()
    };
    let options = Options {
        teams: BTreeMap::from([("team-a".to_owned(), team_a)]),
        ..Options::default()
    };
    let api = serve(support::sqlite().await, options).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let body = json!({"name": "shop", "type": "web", "domains": ["shop.b.example"]});
    let (status, _, problem) = api
        .call(Method::POST, "/v1/instances", &a, Some(body))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(
        (&problem["field"], &problem["value"]),
        (&json!("domains"), &json!("shop.b.example"))
    );
    let body = json!({"name": "shop", "type": "web", "domains": ["shop.a.example"]});
    let (status, _, created) = api
        .call(Method::POST, "/v1/instances", &a, Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["domains"], json!(["shop.a.example"]));
    assert!(
        created["urls"]
            .as_array()
            .unwrap()
            .contains(&json!("https://shop.a.example/")),
        "{created}"
    );
    // Another team's token cannot take the name from it, nor learn who
    // holds it.
    let b = api.token("team-b", TokenRole::Tenant).await;
    let body = json!({"name": "blog", "type": "web", "domains": ["shop.a.example"]});
    let (status, _, problem) = api
        .call(Method::POST, "/v1/instances", &b, Some(body))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        !problem["detail"].as_str().unwrap().contains("shop "),
        "{problem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_answers_the_same_instance_twice() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let post = |body: Value, key: &'static str| {
        api.client
            .post(format!("{}/v1/instances", api.base))
            .bearer_auth(&a)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let body = json!({"name": "shop", "type": "web"});
    let (first, _, one) = answer(post(body.clone(), "k-1").await.unwrap()).await;
    let (second, _, two) = answer(post(body.clone(), "k-1").await.unwrap()).await;
    assert_eq!((first, second), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(one, two);
    let listed = api.store().list_instances().await.unwrap().rows;
    assert_eq!(listed.len(), 1);
    let other = json!({"name": "blog", "type": "web"});
    let (status, _, problem) = answer(post(other, "k-1").await.unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["field"], "Idempotency-Key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_live_token_is_unauthorized() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let response = api
        .client
        .get(format!("{}/v1/instances", api.base))
        .send()
        .await
        .unwrap();
    assert!(response.headers().contains_key("www-authenticate"));
    let (status, content_type, problem) = answer(response).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(problem["field"], "Authorization");
    let unknown = "stead_0000000000000000000000000000000000000000000000000000000000000000";
    let (status, _, _) = api.call(Method::GET, "/v1/instances", unknown, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let a = api.token("team-a", TokenRole::Tenant).await;
    assert_eq!(
        api.call(Method::GET, "/v1/instances", &a, None).await.0,
        StatusCode::OK
    );
    let ops = Ops::new(api.store(), Arc::default(), SystemClock.now(), 7);
    let id = ops.tokens().await.unwrap()[0].id;
    assert!(ops.revoke_token(id).await.unwrap());
    let (status, _, _) = api.call(Method::GET, "/v1/instances", &a, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_the_api_does_not_serve_is_refused() {
    let api = serve(support::memory().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let get = |host: String| {
        api.client
            .get(format!("{}/v1/instances", api.base))
            .bearer_auth(&a)
            .header("host", host)
            .send()
    };
    let (status, _, problem) = answer(get("evil.example".into()).await.unwrap()).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{problem}");
    assert_eq!(
        (&problem["field"], &problem["value"]),
        (&json!("Host"), &json!("evil.example"))
    );
    let port = api.addr.port();
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (status, _, _) = answer(get(host.clone()).await.unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_through_the_api_is_an_event_naming_token_and_team() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    api.create(&a, "shop").await;
    api.call(Method::POST, "/v1/instances/shop/stop", &a, None)
        .await;
    api.call(Method::DELETE, "/v1/instances/shop", &a, None)
        .await;
    let filter = EventFilter {
        kind: Some(EventKind::Api),
        ..EventFilter::default()
    };
    let events = api.store().events(&filter).await.unwrap().rows;
    assert_eq!(events.len(), 3, "{events:?}");
    let token_id = api.store().tokens().await.unwrap()[0].id;
    for logged in &events {
        let event = &logged.event;
        assert_eq!(event.instance.as_ref().unwrap().as_str(), "shop");
        assert!(
            event
                .message
                .contains(&format!("token {token_id} of team team-a")),
            "{}",
            event.message
        );
        assert_eq!(event.writer, format!("api:token-{token_id}@team-a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_rate_is_told_to_wait() {
    let options = Options {
        requests_per_minute: 2,
        ..Options::default()
    };
    let api = serve(support::memory().await, options).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let b = api.token("team-b", TokenRole::Tenant).await;
    for _ in 0..2 {
        let (status, _, _) = api.call(Method::GET, "/v1/instances", &a, None).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _, problem) = api.call(Method::GET, "/v1/instances", &a, None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    // Another token has its own allowance.
    let (status, _, _) = api.call(Method::GET, "/v1/instances", &b, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_3_1_and_describes_every_route() {
    let api = serve(support::memory().await, Options::default()).await;
    let response = api
        .client
        .get(format!("{}/v1/openapi.json", api.base))
        .send()
        .await
        .unwrap();
    let (status, content_type, document) = answer(response).await;
    assert_eq!(
        (status, content_type.as_str()),
        (StatusCode::OK, "application/json")
    );
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    let types = &document["components"]["schemas"]["CreateInstance"]["properties"]["type"]["enum"];
    assert_eq!(types, &json!(["db", "web"]), "the live catalog's types");
    for path in [
        "/v1/instances",
        "/v1/instances/{name}",
        "/v1/instances/{name}/stop",
        "/v1/instances/{name}/start",
        "/v1/instances/{name}/retry",
        "/v1/instances/{name}/inhibit",
        "/v1/instances/{name}/release",
        "/v1/rollouts/{type}/halt",
        "/v1/rollouts/{type}/resume",
    ] {
        assert!(document["paths"][path].is_object(), "{path} missing");
    }
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // Every documented operation is routed: the document and the router
    // are written apart and must not drift.
    let a = api.token("team-a", TokenRole::Tenant).await;
    for (path, operations) in document["paths"].as_object().unwrap() {
        let concrete = path.replace("{name}", "nosuch").replace("{type}", "web");
        for method in operations.as_object().unwrap().keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let (status, _, body) = api.call(method.clone(), &concrete, &a, None).await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(
                !detail.contains("no such endpoint"),
                "{method} {path}: {body}"
            );
        }
    }
}

async fn twenty_concurrent_posts_against_a_quota_of_five_create_five(store: TestStore) {
    let teams = BTreeMap::from([(
        "team-a".to_owned(),
        TeamQuota {
            max_instances: Some(5),
            ..TeamQuota::default()
        },
    )]);
    let options = Options {
        teams,
        ..Options::default()
    };
    let api = Arc::new(serve(store, options).await);
    let a = api.token("team-a", TokenRole::Tenant).await;
    let posts = (0..20).map(|n| {
        let (api, a) = (api.clone(), a.clone());
        tokio::spawn(async move { api.create(&a, &format!("race{n}")).await })
    });
    let mut statuses = BTreeMap::new();
    for post in posts.collect::<Vec<_>>() {
        let (status, _, body) = post.await.unwrap();
        if status == StatusCode::CONFLICT {
            let detail = body["detail"].as_str().unwrap();
            assert!(detail.contains("max_instances = 5"), "{detail}");
        }
        *statuses.entry(status.as_u16()).or_insert(0) += 1;
    }
    assert_eq!(statuses, BTreeMap::from([(201, 5), (409, 15)]));
    let live = api.store().list_instances().await.unwrap().rows;
    assert_eq!(live.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_posts_against_a_quota_of_five_create_five_on_sqlite() {
    twenty_concurrent_posts_against_a_quota_of_five_create_five(support::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_posts_against_a_quota_of_five_create_five_on_postgres() {
    twenty_concurrent_posts_against_a_quota_of_five_create_five(support::postgres().await).await;
}

/// Runs the `stead` binary with `token` in `$STEAD_TOKEN`: exit status and
/// standard output.
async fn stead_cli(api: &Api, token: &str, args: &[&str]) -> (i32, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_stead"));
    command
        .args(["--server", &api.base])
        .args(args)
        .env("STEAD_TOKEN", token)
        .env_remove("STEAD_CONFIG");
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (
        output.status.code().unwrap_or(-1),
        format!("{stdout}{stderr}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_the_instance_commands_through_the_api() {
    let api = serve(support::sqlite().await, Options::default()).await;
    let a = api.token("team-a", TokenRole::Tenant).await;
    let b = api.token("team-b", TokenRole::Tenant).await;
    let (code, out) = stead_cli(&api, &a, &["instance", "create", "shop", "--type", "web"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("served at http://http.shop.localhost:8080/"),
        "{out}"
    );
    let (code, out) = stead_cli(&api, &a, &["instance", "list"]).await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("shop  team-a  web  1  provisioning"),
        "{out}"
    );
    let (code, _) = stead_cli(&api, &a, &["instance", "stop", "shop"]).await;
    assert_eq!(code, 0);
    let instance = api
        .store()
        .instance(&stead::core::types::InstanceName::new("shop"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        instance.stopped,
        "the stop went through the API to the store"
    );
    // Team b's token: not found (exit 3), and nothing changes.
    let (code, _) = stead_cli(&api, &b, &["instance", "delete", "shop"]).await;
    assert_eq!(code, 3);
    // A hold and its release, on the service ACTIVE names (as a worker
    // that provisioned it would have recorded).
    let shop = stead::core::types::InstanceName::new("shop");
    let active = stead::core::types::ActiveService {
        container: stead::core::types::ContainerId::new("c1"),
        effective_revision: "1.r".into(),
        binds: BTreeMap::new(),
        stop_grace: None,
        verified_started_at: None,
    };
    api.store()
        .save_active_service(&shop, &"http".into(), &active)
        .await
        .unwrap();
    let inhibit = ["instance", "inhibit", "shop", "--service", "http"];
    let (code, out) = stead_cli(&api, &a, &inhibit).await;
    assert_eq!(code, 0, "{out}");
    let holds = api.store().load_inhibitions(&shop).await.unwrap();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(holds[0].container.as_str(), "c1");
    // Team b holds nothing of team a's.
    let (code, _) = stead_cli(&api, &b, &inhibit).await;
    assert_eq!(code, 3);
    let release = ["instance", "release", "shop", "--service", "http"];
    let (code, out) = stead_cli(&api, &a, &release).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("released 1 hold"), "{out}");
    assert!(api
        .store()
        .load_inhibitions(&shop)
        .await
        .unwrap()
        .is_empty());
    let (code, out) = stead_cli(&api, &a, &["instance", "delete", "shop", "--purge-volumes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("named volumes go with it"), "{out}");
    let deleted = api.store().instance(&shop).await.unwrap().unwrap();
    assert!(deleted.purge_volumes, "the purge reached the store");
    // Commands beyond the instance ones are refused, not run locally.
    let (code, _) = stead_cli(&api, &a, &["task", "list"]).await;
    assert_eq!(code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_until_one_closes() {
    let options = Options {
        max_connections: 1,
        ..Options::default()
    };
    let api = serve(support::memory().await, options).await;
    let held = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    let document = format!("{}/v1/openapi.json", api.base);
    let waiting = api
        .client
        .get(&document)
        .timeout(std::time::Duration::from_millis(500))
        .send()
        .await;
    assert!(
        waiting.is_err(),
        "a second connection was served past the cap"
    );
    drop(held);
    let served = api.client.get(&document).send().await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_and_frees_its_place() {
    let options = Options {
        max_connections: 1,
        idle_timeout: std::time::Duration::from_millis(300),
        ..Options::default()
    };
    let api = serve(support::memory().await, options).await;
    // Holds the only place and sends nothing: closed after the idle time,
    // so the next client is served without this one going away.
    let _idle = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    let document = format!("{}/v1/openapi.json", api.base);
    let served = api
        .client
        .get(&document)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
}
