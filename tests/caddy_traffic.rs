//! The Caddy traffic adapter against a real `caddy run` (one per test) and
//! small loopback HTTP backends.

mod support_services;

use std::time::Duration;

use stead::adapters::caddy::{etag, CaddyConfig, CaddyTraffic, ServerCheck};
use stead::adapters::probe::NetProbe;
use stead::core::spec::ReadinessProbe;
use stead::core::types::{Binds, ContainerId, ServiceKey};
use stead::ports::{
    ErrorKind, PortFailure, Probe, ProbeTarget, Route, Runtime, Traffic, TrafficError,
};
use support_services::caddy::CaddyProcess;
use support_services::docker::{create_request, docker, httpd_spec, runtime, Cleanup, HTTP_PORT};
use support_services::{free_port, unique};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A backend that answers every request with 200 and `body`, until the
/// test ends.
async fn backend(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind backend");
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    port
}

struct Fixture {
    _caddy: CaddyProcess,
    traffic: CaddyTraffic,
    listen_port: u16,
}

async fn fixture() -> Fixture {
    fixture_on(CaddyProcess::start().await).await
}

/// stead's server created in `caddy`, on a free listen port.
async fn fixture_on(caddy: CaddyProcess) -> Fixture {
    let listen_port = free_port();
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        listen_addr: format!("127.0.0.1:{listen_port}"),
        ..CaddyConfig::default()
    })
    .expect("client");
    assert_eq!(
        traffic.ensure_server().await.expect("ensure server"),
        ServerCheck::Created
    );
    Fixture {
        _caddy: caddy,
        traffic,
        listen_port,
    }
}

fn key(instance: &str, service: &str) -> ServiceKey {
    ServiceKey {
        instance: instance.into(),
        service: service.into(),
    }
}

fn route(service: ServiceKey, host_port: u16) -> Route {
    Route {
        service,
        container: ContainerId::new("c1"),
        binds: Binds::from([(8080, host_port)]),
        verified_started_at: None,
        public_hosts: Vec::new(),
    }
}

/// GET `/` through Caddy with the host name of `service`.
async fn get(fixture: &Fixture, service: &ServiceKey) -> (u16, String) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .unwrap();
    let response = client
        .get(format!("http://127.0.0.1:{}/", fixture.listen_port))
        .header("host", fixture.traffic.host(service))
        .send()
        .await
        .expect("caddy answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

async fn routes_with_id(fixture: &Fixture, id: &str) -> usize {
    let url = format!(
        "http://{}/config/apps/http/servers/stead/routes",
        fixture.traffic.config().admin_addr
    );
    let routes: Vec<serde_json::Value> = reqwest::get(url).await.unwrap().json().await.unwrap();
    routes.iter().filter(|r| r["@id"] == id).count()
}

#[tokio::test]
async fn a_published_route_serves_through_caddy() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    assert_eq!(get(&fixture, &web).await, (200, "backend-a".to_owned()));
    assert_eq!(fixture.traffic.host(&web), "web.shop.localhost");
}

/// #54: stead drives Caddy over a unix socket, which only its file
/// permissions guard, instead of a TCP port every local user can reach.
#[tokio::test]
async fn the_admin_api_is_driven_over_a_unix_socket() {
    let caddy = CaddyProcess::start_on_unix_socket().await;
    assert!(
        caddy.admin_addr.starts_with("unix//"),
        "{}",
        caddy.admin_addr
    );
    let fixture = fixture_on(caddy).await;
    let web = key("shop", "web");
    let port = backend("over-the-socket").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    assert_eq!(
        get(&fixture, &web).await,
        (200, "over-the-socket".to_owned())
    );
    assert_eq!(
        fixture.traffic.route_status(&web).await.unwrap().as_u16(),
        200
    );
    fixture.traffic.withdraw(&web).await.expect("withdraw");
    assert_eq!(get(&fixture, &web).await.0, 404);
    assert_eq!(
        fixture.traffic.route_status(&web).await.unwrap().as_u16(),
        404
    );
}

#[tokio::test]
async fn publishing_again_replaces_the_route_in_place() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let first = backend("backend-a").await;
    let second = backend("backend-b").await;
    fixture
        .traffic
        .publish(&route(web.clone(), first))
        .await
        .expect("publish a");
    fixture
        .traffic
        .publish(&route(web.clone(), second))
        .await
        .expect("publish b");
    assert_eq!(get(&fixture, &web).await, (200, "backend-b".to_owned()));
    assert_eq!(routes_with_id(&fixture, "stead.shop.web").await, 1);
}

#[tokio::test]
async fn services_are_routed_by_host_independently() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let api = key("shop", "api");
    let other = key("blog", "web");
    for (service, body) in [(&web, "web"), (&api, "api"), (&other, "blog")] {
        let port = backend(body).await;
        fixture
            .traffic
            .publish(&route(service.clone(), port))
            .await
            .expect("publish");
    }
    assert_eq!(get(&fixture, &web).await.1, "web");
    assert_eq!(get(&fixture, &api).await.1, "api");
    assert_eq!(get(&fixture, &other).await.1, "blog");
    fixture.traffic.withdraw(&api).await.expect("withdraw api");
    assert_eq!(
        get(&fixture, &web).await.1,
        "web",
        "withdraw touches one route"
    );
    assert_eq!(get(&fixture, &api).await.0, 404);
}

#[tokio::test]
async fn withdraw_stops_routing_and_an_absent_route_counts_as_withdrawn() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    fixture.traffic.withdraw(&web).await.expect("withdraw");
    let (status, body) = get(&fixture, &web).await;
    assert_eq!((status, body.trim()), (404, "no route"));
    fixture
        .traffic
        .withdraw(&web)
        .await
        .expect("withdrawing again is fine");
    fixture
        .traffic
        .withdraw(&key("never", "published"))
        .await
        .expect("withdrawing what was never published is fine");
}

#[tokio::test]
async fn a_dead_backend_answers_bad_gateway() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    // Nothing listens on a port that was free a moment ago.
    fixture
        .traffic
        .publish(&route(web.clone(), free_port()))
        .await
        .expect("publish");
    assert_eq!(get(&fixture, &web).await.0, 502);
}

#[tokio::test]
async fn ensure_server_is_idempotent() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    assert_eq!(
        fixture.traffic.ensure_server().await.expect("ensure again"),
        ServerCheck::Present
    );
    assert_eq!(get(&fixture, &web).await, (200, "backend-a".to_owned()));
}

#[tokio::test]
async fn ensure_server_corrects_a_listen_address_that_differs_from_the_config() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    // Someone moved stead's server to another port.
    let moved = CaddyTraffic::new(CaddyConfig {
        listen_addr: format!("127.0.0.1:{}", free_port()),
        ..fixture.traffic.config().clone()
    })
    .unwrap();
    assert!(matches!(
        moved.ensure_server().await.expect("move"),
        ServerCheck::ListenCorrected { .. }
    ));
    let check = fixture.traffic.ensure_server().await.expect("correct");
    assert!(
        matches!(&check, ServerCheck::ListenCorrected { was } if was.len() == 1),
        "{check:?}"
    );
    assert_eq!(
        get(&fixture, &web).await,
        (200, "backend-a".to_owned()),
        "the routes survive the correction"
    );
}

#[tokio::test]
async fn a_publish_after_caddy_lost_its_config_recreates_the_server() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    // As a Caddy restarted without --resume: only the admin endpoint.
    let admin = &fixture.traffic.config().admin_addr;
    let empty = serde_json::json!({ "admin": { "listen": admin } });
    let loaded = reqwest::Client::new()
        .post(format!("http://{admin}/load"))
        .json(&empty)
        .send()
        .await
        .expect("load an empty config");
    assert!(loaded.status().is_success());
    let created_before = fixture.traffic.servers_created();
    fixture
        .traffic
        .withdraw(&web)
        .await
        .expect("no server means nothing to withdraw");
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish creates the server");
    assert_eq!(get(&fixture, &web).await, (200, "backend-a".to_owned()));
    // The e2e tests prove Caddy lost its config by this count; a creation
    // by a publish racing the pass's check must count as one too.
    assert_eq!(
        fixture.traffic.servers_created(),
        created_before + 1,
        "the server a publish recreated was not counted"
    );
}

/// The regression behind issue #11's 404s: Caddy resolves `/id/<id>` to an
/// array index before it takes its config lock, so concurrent changes
/// through `/id/` paths replaced and deleted each other's routes. Many
/// concurrent publishes and withdrawals of some services must never touch
/// the routes of others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_never_touch_another_services_route() {
    let fixture = fixture().await;
    let steady: Vec<ServiceKey> = (0..5).map(|i| key(&format!("steady{i}"), "web")).collect();
    for (i, service) in steady.iter().enumerate() {
        let port = backend(["s0", "s1", "s2", "s3", "s4"][i]).await;
        fixture
            .traffic
            .publish(&route(service.clone(), port))
            .await
            .expect("publish steady");
    }
    let churn_port = backend("churn").await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let traffic = fixture.traffic.clone();
        let service = key(&format!("churn{i}"), "web");
        tasks.spawn(async move {
            for _ in 0..5 {
                traffic
                    .publish(&route(service.clone(), churn_port))
                    .await
                    .expect("publish churn");
                traffic.withdraw(&service).await.expect("withdraw churn");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("churn task");
    }
    for (i, service) in steady.iter().enumerate() {
        assert_eq!(
            get(&fixture, service).await,
            (200, format!("s{i}")),
            "{service:?} kept its route through the churn"
        );
    }
    let routes = fixture.traffic.routes().await.unwrap().expect("server");
    assert_eq!(
        routes.len(),
        steady.len(),
        "every churned route withdrawn: {routes:?}"
    );
}

#[tokio::test]
async fn changes_waiting_on_a_write_share_the_next_one() {
    let fixture = fixture().await;
    let port = backend("backend").await;
    let services: Vec<ServiceKey> = (0..20).map(|i| key(&format!("shop{i}"), "web")).collect();
    let before = fixture.traffic.route_writes();
    // Polled in order on one task: the first change takes the write lock
    // alone; the other nineteen queue behind it and go out in one write.
    let routes: Vec<Route> = services.iter().map(|s| route(s.clone(), port)).collect();
    let results =
        futures_util::future::join_all(routes.iter().map(|r| fixture.traffic.publish(r))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(fixture.traffic.route_writes() - before, 2);
    for service in &services {
        assert_eq!(get(&fixture, service).await.0, 200);
    }
}

#[tokio::test]
async fn a_change_that_changes_nothing_writes_nothing() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish");
    let before = fixture.traffic.route_writes();
    fixture
        .traffic
        .publish(&route(web.clone(), port))
        .await
        .expect("publish the same route");
    fixture
        .traffic
        .withdraw(&key("never", "published"))
        .await
        .expect("withdraw an absent route");
    assert_eq!(fixture.traffic.route_writes(), before, "no reload");
}

#[tokio::test]
async fn a_legacy_route_is_taken_over_in_place() {
    let fixture = fixture().await;
    let web = key("shop", "web");
    let old = backend("old").await;
    let new = backend("new").await;
    // A route as stead 0.1 wrote it (id `stead-<instance>-<service>`).
    let admin = &fixture.traffic.config().admin_addr;
    let legacy = serde_json::json!({
        "@id": "stead-shop-web",
        "match": [{ "host": ["web.shop.localhost"] }],
        "handle": [{ "handler": "reverse_proxy", "upstreams": [{ "dial": format!("127.0.0.1:{old}") }] }],
        "terminal": true,
    });
    let put = reqwest::Client::new()
        .put(format!(
            "http://{admin}/config/apps/http/servers/stead/routes/0"
        ))
        .json(&legacy)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    assert_eq!(get(&fixture, &web).await.1, "old");
    fixture
        .traffic
        .publish(&route(web.clone(), new))
        .await
        .expect("publish");
    assert_eq!(get(&fixture, &web).await.1, "new");
    assert_eq!(routes_with_id(&fixture, "stead-shop-web").await, 0);
    assert_eq!(routes_with_id(&fixture, "stead.shop.web").await, 1);
}

#[tokio::test]
async fn caddy_accepts_the_computed_etag_and_refuses_a_stale_one() {
    let fixture = fixture().await;
    let admin = &fixture.traffic.config().admin_addr;
    let path = "/config/apps/http/servers/stead/routes";
    let body = reqwest::get(format!("http://{admin}{path}"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let patch = |tag: String| {
        client
            .patch(format!("http://{admin}{path}"))
            .header("If-Match", tag)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let stale = patch(etag(path, b"[]\n")).await.unwrap();
    assert_eq!(stale.status().as_u16(), 412);
    let current = patch(etag(path, &body)).await.unwrap();
    assert!(current.status().is_success(), "{}", current.status());
}

#[tokio::test]
async fn caddy_refusals_are_errors_with_status_and_body() {
    let caddy = CaddyProcess::start().await;
    // A listen address Caddy cannot parse: creating the server is refused.
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        listen_addr: "127.0.0.1:notaport".to_owned(),
        ..CaddyConfig::default()
    })
    .unwrap();
    let error = traffic
        .publish(&route(key("shop", "web"), 1234))
        .await
        .expect_err("publishing onto a server Caddy refuses fails");
    // Caddy refuses with a 4xx or 5xx and says why; both reach the error.
    assert!(matches!(error, TrafficError::Rejected(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("caddy PUT /config/apps: "), "{message}");
    assert!(
        message.contains("\"error\""),
        "the body excerpt is kept: {message}"
    );

    let empty = Route {
        binds: Binds::new(),
        ..route(key("shop", "web"), 1)
    };
    let error = traffic.publish(&empty).await.expect_err("no binds");
    assert!(matches!(error, TrafficError::Rejected(_)), "{error:?}");
    assert!(
        error.to_string().contains("stead.shop.web has no binds"),
        "{error}"
    );
}

#[tokio::test]
async fn an_unreachable_admin_api_is_an_error() {
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: format!("127.0.0.1:{}", free_port()),
        request_timeout: Duration::from_secs(2),
        ..CaddyConfig::default()
    })
    .unwrap();
    let error = traffic
        .withdraw(&key("shop", "web"))
        .await
        .expect_err("unreachable");
    assert!(matches!(error, TrafficError::Unreachable(_)), "{error:?}");
    assert_eq!(error.kind(), ErrorKind::Unavailable);
    assert!(error.to_string().contains("did not answer"), "{error}");
}

#[tokio::test]
async fn a_verified_busybox_container_is_served_through_caddy() {
    let fixture = fixture().await;
    let runtime = runtime().await;
    let instance = unique("ct");
    let _cleanup = Cleanup::new(&instance);
    let container = runtime
        .create(&create_request(&instance, httpd_spec("web"), "r1"))
        .await
        .expect("create");
    let binds = runtime.binds(&container).await.expect("binds");
    let readiness = ReadinessProbe::Http {
        port: HTTP_PORT,
        path: "/".to_owned(),
        timeout: Duration::from_secs(1),
        interval: Duration::from_millis(100),
        attempts_max: 50,
    };
    NetProbe::new()
        .unwrap()
        .ready(
            &readiness,
            &ProbeTarget {
                container: container.clone(),
                started_at: runtime.inspect(&container).await.unwrap().started_at,
                binds: binds.clone(),
            },
        )
        .await
        .expect("busybox httpd is ready");

    let web = key(&instance, "web");
    let route = Route {
        service: web.clone(),
        container: container.clone(),
        binds,
        verified_started_at: runtime.inspect(&container).await.unwrap().started_at,
        public_hosts: Vec::new(),
    };
    fixture.traffic.publish(&route).await.expect("publish");
    let (status, body) = get(&fixture, &web).await;
    assert_eq!(status, 200);
    assert!(body.contains("stead test"), "{body}");

    docker(&["kill", container.as_str()]).expect("docker kill");
    assert_eq!(
        get(&fixture, &web).await.0,
        502,
        "a dead backend is a bad gateway"
    );
    fixture.traffic.withdraw(&web).await.expect("withdraw");
    assert_eq!(get(&fixture, &web).await.0, 404, "withdrawn: no route");
}

#[tokio::test]
async fn a_route_is_found_by_its_id_url_exactly_while_it_is_published() {
    let f = fixture().await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let admin = f.traffic.config().admin_addr.clone();
    let status = |service: ServiceKey| {
        let client = client.clone();
        let url = CaddyTraffic::route_id_url(&admin, &service).expect("url");
        async move { client.get(url).send().await.expect("caddy").status() }
    };
    let shop = key("shop", "web");
    f.traffic
        .publish(&route(shop.clone(), backend("shop").await))
        .await
        .expect("publish");
    assert!(status(shop.clone()).await.is_success());
    // An id that climbs out of `/id/`: Caddy decodes and cleans even the
    // encoded path and redirects to `/config/`; not followed, it finds
    // nothing rather than reading as a published route.
    let escape = key("x/../../config#", "web");
    assert!(!status(escape).await.is_success());
    f.traffic.withdraw(&shop).await.expect("withdraw");
    assert_eq!(status(shop).await.as_u16(), 404);
}

/// A fake Caddy admin API that answers every request with 200 and a
/// chunked body of `len` bytes (no length announced), then closes.
async fn oversized_admin(len: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake admin");
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 1024 * 1024];
                let mut sent = 0;
                while sent < len {
                    let n = chunk.len().min(len - sent);
                    let framed = [format!("{n:x}\r\n").as_bytes(), &chunk[..n], b"\r\n"].concat();
                    if stream.write_all(&framed).await.is_err() {
                        return; // the client stopped reading: what the bound is for
                    }
                    sent += n;
                }
                let _ = stream.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_oversized_admin_answer_is_refused_naming_the_call_and_the_bound() {
    use stead::adapters::caddy::CADDY_ANSWER_LEN_MAX;
    let admin = oversized_admin(CADDY_ANSWER_LEN_MAX + 1024 * 1024).await;
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: admin,
        ..CaddyConfig::default()
    })
    .expect("client");
    let Err(TrafficError::Rejected(message)) = traffic.routes().await else {
        panic!("an answer over the bound must be refused");
    };
    assert!(
        message.starts_with("caddy GET /config/apps/http/servers/")
            && message.ends_with(&format!(
                "the answer is larger than {CADDY_ANSWER_LEN_MAX} bytes, the most stead reads \
                 from Caddy's admin API"
            )),
        "{message}"
    );
}
