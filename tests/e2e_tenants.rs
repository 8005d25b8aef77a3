//! #54's front door on real dockerd and Caddy: a tenant creates an
//! instance through the API, reads where it is served from the answer and
//! is served there; another team cannot see or touch it; an operator can
//! halt its type; the API answers no host it does not serve.

// Latency and deadlines in tests are wall-clock by nature.
#![allow(clippy::disallowed_methods)]

mod e2e;
mod support;
mod support_services;

use std::sync::Arc;
use std::time::Duration;

use e2e::{wait_until, Harness, Setup};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use stead::engine::SystemClock;
use stead::ops::{Ops, TokenRequest};
use stead::ports::{Clock, TokenRole};
use support_services::docker::Cleanup;
use support_services::{free_port, unique};

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// A token of `team` with `role`, as `stead token create` makes it.
async fn token(harness: &Harness, team: &str, role: TokenRole) -> String {
    let ops = Ops::new(
        harness.daemon().ports.store.as_ref(),
        Arc::default(),
        SystemClock.now(),
        11,
    );
    let request = TokenRequest {
        team: team.into(),
        role,
        expires_in: None,
        label: "e2e".into(),
    };
    ops.create_token(&request).await.expect("token").1
}

/// GET `url` through Caddy: its host name in `Host`, to Caddy's listener.
async fn served(harness: &Harness, url: &str) -> u16 {
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    match http
        .get(format!("http://{}/", harness.listen))
        .header("host", host)
        .send()
        .await
    {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_served_at_the_url_the_api_gave_and_no_other_team_reaches_it() {
    let api_port = free_port();
    let harness = Harness::start(Setup {
        top_config: format!("api_listen = \"127.0.0.1:{api_port}\"\n"),
        extra_config: "[teams.team-a]\nmax_instances = 2\n".into(),
        ..Setup::default()
    })
    .await;
    let name = unique("tenant");
    let _cleanup = Cleanup::new(&name);
    let api = Api {
        base: format!("http://127.0.0.1:{api_port}"),
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
    };
    let (a, b) = (
        token(&harness, "team-a", TokenRole::Tenant).await,
        token(&harness, "team-b", TokenRole::Tenant).await,
    );
    let operator = token(&harness, "platform", TokenRole::Operator).await;

    let (status, created) = api
        .call(
            Method::POST,
            "/v1/instances",
            &a,
            Some(json!({"name": name, "type": "web"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let url = created["urls"][0]
        .as_str()
        .expect("a URL in the answer")
        .to_owned();
    assert!(
        url.starts_with(&format!("http://http.{name}.localhost")),
        "{url}"
    );
    wait_until(
        "the instance is served at its URL",
        Duration::from_secs(90),
        || async { served(&harness, &url).await == 200 },
    )
    .await;

    // Team B: not found, whatever it tries, and nothing changes.
    let path = format!("/v1/instances/{name}");
    assert_eq!(
        api.call(Method::GET, &path, &b, None).await.0,
        StatusCode::NOT_FOUND
    );
    for verb in ["stop", "retry"] {
        let (status, body) = api
            .call(Method::POST, &format!("{path}/{verb}"), &b, None)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{verb}: {body}");
    }
    assert_eq!(
        api.call(Method::DELETE, &path, &b, None).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, listed) = api.call(Method::GET, "/v1/instances", &b, None).await;
    assert!(
        !listed.to_string().contains(&name),
        "team B lists it: {listed}"
    );
    assert_eq!(
        served(&harness, &url).await,
        200,
        "still served after team B tried"
    );

    // A tenant cannot halt a type; an operator can.
    let halt = "/v1/rollouts/web/halt";
    assert_eq!(
        api.call(Method::POST, halt, &a, None).await.0,
        StatusCode::FORBIDDEN
    );
    let (status, body) = api.call(Method::POST, halt, &operator, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rollouts = harness.daemon().ports.store.rollouts().await.unwrap();
    assert_eq!(rollouts["web"], stead::core::fleet::RolloutState::Halted);

    // A web page rebinding its name to the API's address reaches nothing.
    let rebound = api
        .http
        .get(format!("{}/v1/instances", api.base))
        .header("host", "evil.example")
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);

    // The owner stops it through the API: withdrawn.
    let (status, body) = api
        .call(Method::POST, &format!("{path}/stop"), &a, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_until(
        "a stopped instance is withdrawn",
        Duration::from_secs(30),
        || async { served(&harness, &url).await != 200 },
    )
    .await;
}

/// Whether a TCP connection from inside container `from` to
/// `address:8080` opens (busybox nc, bounded by its own timeout).
fn connects(from: &str, address: &str) -> bool {
    support_services::docker::docker(&["exec", from, "busybox", "nc", "-w", "2", address, "8080"])
        .is_ok()
}

/// #54's walls through the whole daemon: two tenants' instances, each
/// served; from inside one, the other's container cannot be reached at
/// any of its addresses, and neither container can open raw sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_container_reaches_no_other_and_has_no_raw_sockets() {
    let harness = Harness::start(Setup::default()).await;
    let (a, b) = (unique("walla"), unique("wallb"));
    let _cleanup = (Cleanup::new(&a), Cleanup::new(&b));
    for name in [&a, &b] {
        harness.create(name, None).await;
    }
    for name in [&a, &b] {
        wait_until("served", Duration::from_secs(90), || async {
            harness.get(name).await == 200
        })
        .await;
    }
    let a_id = harness.active_container(&a).await.expect("a's container");
    let b_id = harness.active_container(&b).await.expect("b's container");
    assert!(connects(&a_id, "127.0.0.1"), "a answers on its own port");
    let addresses = support_services::docker::docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        &b_id,
    ])
    .unwrap();
    assert!(!addresses.trim().is_empty(), "b has an address");
    for address in addresses.split_whitespace() {
        assert!(!connects(&a_id, address), "a reaches b at {address}");
    }
    for id in [&a_id, &b_id] {
        let status =
            support_services::docker::docker(&["exec", id, "busybox", "cat", "/proc/self/status"])
                .unwrap();
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .expect("CapEff");
        let bits = u64::from_str_radix(effective.trim(), 16).unwrap();
        assert_eq!(bits & (1 << 13), 0, "{id} keeps NET_RAW");
    }
}
