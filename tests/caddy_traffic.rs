//! The Caddy traffic adapter against a real `caddy run` (one per test) and
//! small loopback HTTP backends.

mod support_services;

use std::time::Duration;

use stead::adapters::caddy::{CaddyConfig, CaddyTraffic};
use stead::adapters::probe::NetProbe;
use stead::core::spec::ReadinessProbe;
use stead::core::types::{Binds, ContainerId, ServiceKey};
use stead::ports::{Probe, Route, Runtime, Traffic};
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
    let caddy = CaddyProcess::start().await;
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        ..CaddyConfig::default()
    })
    .expect("client");
    let listen_port = free_port();
    traffic
        .ensure_server(&format!("127.0.0.1:{listen_port}"))
        .await
        .expect("ensure server");
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
    assert_eq!(routes_with_id(&fixture, "stead-shop-web").await, 1);
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
    fixture
        .traffic
        .ensure_server("127.0.0.1:1")
        .await
        .expect("ensure again");
    assert_eq!(get(&fixture, &web).await, (200, "backend-a".to_owned()));
}

#[tokio::test]
async fn caddy_refusals_are_errors_with_status_and_body() {
    let caddy = CaddyProcess::start().await;
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        ..CaddyConfig::default()
    })
    .unwrap();
    // No server was ensured: there is no routes array to insert into.
    let error = traffic
        .publish(&route(key("shop", "web"), 1234))
        .await
        .expect_err("publishing without a server fails");
    // Caddy refuses with a 5xx and says why; both reach the error.
    let message = &error.0;
    assert!(
        message.contains("caddy PUT /config/apps/http/servers/stead/routes/0: 500"),
        "{message}"
    );
    assert!(
        message.contains("\"error\""),
        "the body excerpt is kept: {message}"
    );

    let empty = Route {
        binds: Binds::new(),
        ..route(key("shop", "web"), 1)
    };
    let error = traffic.publish(&empty).await.expect_err("no binds");
    assert!(error.0.contains("stead-shop-web has no binds"), "{error}");
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
    assert!(error.0.contains("did not answer"), "{error}");
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
        .ready(&readiness, &binds)
        .await
        .expect("busybox httpd is ready");

    let web = key(&instance, "web");
    let route = Route {
        service: web.clone(),
        container: container.clone(),
        binds,
        verified_started_at: runtime.inspect(&container).await.unwrap().started_at,
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
