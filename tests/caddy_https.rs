//! HTTPS for public host names (#43) through the Caddy adapter against a
//! real `caddy run` (one per test) with Caddy's internal issuer, since no
//! ACME CA is reachable here: the served certificate is checked against
//! the root Caddy's admin API gives (`/pki/ca/local`), as `curl --cacert`
//! would, with the host resolved to loopback.

mod support_services;

use std::time::Duration;

use stead::adapters::caddy::{CaddyConfig, CaddyTls, CaddyTraffic, ServerCheck, TlsIssuer};
use stead::core::types::{Binds, ContainerId, ServiceKey};
use stead::ports::{HeldRoute, Route, Traffic, TrafficError};
use support_services::caddy::CaddyProcess;
use support_services::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A backend that answers every request with 200 and `body`.
async fn backend(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
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
    caddy: CaddyProcess,
    traffic: CaddyTraffic,
    http_port: u16,
    https_port: u16,
}

async fn fixture(issuer: TlsIssuer) -> Fixture {
    let caddy = CaddyProcess::start().await;
    let (http_port, https_port) = (free_port(), free_port());
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        listen_addr: format!("127.0.0.1:{http_port}"),
        tls: Some(CaddyTls {
            issuer,
            listen_addr: format!("127.0.0.1:{https_port}"),
            domain: Some("apps.example.test".to_owned()),
            hsts_max_age: Some(Duration::from_secs(600)),
        }),
        ..CaddyConfig::default()
    })
    .expect("client");
    assert_eq!(
        traffic.ensure_server().await.expect("ensure"),
        ServerCheck::Created
    );
    Fixture {
        caddy,
        traffic,
        http_port,
        https_port,
    }
}

fn key(instance: &str, service: &str) -> ServiceKey {
    ServiceKey {
        instance: instance.into(),
        service: service.into(),
    }
}

fn route(service: &ServiceKey, host_port: u16, public_hosts: &[&str]) -> Route {
    Route {
        service: service.clone(),
        container: ContainerId::new("c1"),
        binds: Binds::from([(8080, host_port)]),
        verified_started_at: None,
        public_hosts: public_hosts.iter().map(|h| (*h).to_owned()).collect(),
    }
}

fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The root certificate of Caddy's local CA, from its admin API.
async fn local_root(admin: &str) -> reqwest::Certificate {
    let ca: serde_json::Value = plain_client()
        .get(format!("http://{admin}/pki/ca/local"))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("json");
    let pem = ca["root_certificate"].as_str().expect("a root certificate");
    reqwest::Certificate::from_pem(pem.as_bytes()).expect("PEM")
}

/// A client that trusts only Caddy's local root and resolves `host` to
/// the HTTPS server on loopback.
async fn https_client(fixture: &Fixture, host: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(local_root(&fixture.caddy.admin_addr).await)
        .resolve(host, ([127, 0, 0, 1], fixture.https_port).into())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// GET `https://host/` until it answers (a certificate is issued in the
/// background after a reload), for at most `ISSUE_WAIT`.
async fn get_https(fixture: &Fixture, host: &str) -> Result<reqwest::Response, String> {
    const ISSUE_WAIT: Duration = Duration::from_secs(20);
    let client = https_client(fixture, host).await;
    let url = format!("https://{host}:{}/", fixture.https_port);
    let deadline = tokio::time::Instant::now() + ISSUE_WAIT;
    loop {
        match client.get(&url).send().await {
            Ok(response) => return Ok(response),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(format!("{e:?}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test]
async fn a_public_host_is_served_over_https_with_a_certificate_of_caddys_internal_ca() {
    let fixture = fixture(TlsIssuer::Internal).await;
    let shop = key("shop", "web");
    let port = backend("backend-a").await;
    fixture
        .traffic
        .publish(&route(&shop, port, &["shop.example.test"]))
        .await
        .expect("publish");
    for host in ["shop.example.test", "web.shop.apps.example.test"] {
        let response = get_https(&fixture, host).await.expect("served over HTTPS");
        assert_eq!(response.status(), 200, "{host}");
        assert_eq!(
            response.headers()["strict-transport-security"],
            "max-age=600"
        );
        assert_eq!(response.text().await.unwrap(), "backend-a");
    }
    // HTTP of a public host is redirected to HTTPS, path and query kept.
    let redirect = plain_client()
        .get(format!("http://127.0.0.1:{}/a?b=1", fixture.http_port))
        .header("host", "shop.example.test")
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 308);
    assert_eq!(
        redirect.headers()["location"],
        format!("https://shop.example.test:{}/a?b=1", fixture.https_port).as_str()
    );
    // The loopback name is still plain HTTP, as without HTTPS.
    let loopback = plain_client()
        .get(format!("http://127.0.0.1:{}/", fixture.http_port))
        .header("host", fixture.traffic.host(&shop))
        .send()
        .await
        .unwrap();
    assert_eq!(loopback.status(), 200);
    // Withdrawn: no route, and no policy of stead's is left in Caddy.
    fixture.traffic.withdraw(&shop).await.expect("withdraw");
    // One attempt: Caddy refuses the handshake, or its catch-all answers.
    let after = https_client(&fixture, "shop.example.test")
        .await
        .get(format!("https://shop.example.test:{}/", fixture.https_port))
        .send()
        .await;
    assert!(
        after.as_ref().map_or(true, |r| r.status() == 404),
        "a withdrawn host is not served: {after:?}"
    );
    let policies: serde_json::Value = plain_client()
        .get(format!(
            "http://{}/config/apps/tls/automation/policies",
            fixture.caddy.admin_addr
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        policies.as_array().is_none_or(|p| p.is_empty()),
        "{policies}"
    );
}

#[tokio::test]
async fn a_host_another_instance_holds_is_refused_at_publish_and_the_holder_keeps_it() {
    let fixture = fixture(TlsIssuer::Internal).await;
    let (a, b) = (key("a", "web"), key("b", "web"));
    let (port_a, port_b) = (backend("a").await, backend("b").await);
    fixture
        .traffic
        .publish(&route(&a, port_a, &["shop.example.test"]))
        .await
        .expect("the first claim is published");
    let refused = fixture
        .traffic
        .publish(&route(&b, port_b, &["shop.example.test"]))
        .await;
    let Err(TrafficError::Rejected(why)) = refused else {
        panic!("a second claim of a host must be refused: {refused:?}");
    };
    assert!(
        why.contains("host shop.example.test is already served by tls.stead.a.web"),
        "{why}"
    );
    let response = get_https(&fixture, "shop.example.test").await.unwrap();
    assert_eq!(response.text().await.unwrap(), "a");
    // Nothing of b's was written, not even its loopback route.
    assert!(!fixture.traffic.is_published(&b).await.unwrap());
}

#[tokio::test]
async fn a_lost_https_route_reads_back_as_wrong_so_the_pass_republishes_it() {
    let fixture = fixture(TlsIssuer::Internal).await;
    let shop = key("shop", "web");
    let port = backend("a").await;
    fixture
        .traffic
        .publish(&route(&shop, port, &[]))
        .await
        .unwrap();
    let held = fixture.traffic.held_routes().await.unwrap();
    assert_eq!(
        held,
        [HeldRoute {
            service: shop.clone(),
            port
        }]
    );
    // Someone removes the HTTPS route by hand; the HTTP one stays.
    let routes = format!(
        "http://{}/config/apps/http/servers/{}/routes/0",
        fixture.caddy.admin_addr,
        fixture.traffic.tls_server_name()
    );
    let removed = plain_client().delete(routes).send().await.unwrap();
    assert!(removed.status().is_success(), "{removed:?}");
    let held = fixture.traffic.held_routes().await.unwrap();
    assert_eq!(
        held,
        [HeldRoute {
            service: shop.clone(),
            port: 0
        }]
    );
    fixture
        .traffic
        .publish(&route(&shop, port, &[]))
        .await
        .unwrap();
    assert_eq!(fixture.traffic.held_routes().await.unwrap()[0].port, port);
}

#[tokio::test]
async fn an_acme_policy_is_accepted_by_caddy_with_its_email_and_directory() {
    // A directory nobody answers on: Caddy takes the config and retries
    // issuance in the background, without reaching outside the host.
    let fixture = fixture(TlsIssuer::Acme {
        email: Some("ops@example.test".to_owned()),
        ca: Some(format!("https://127.0.0.1:{}/directory", free_port())),
    })
    .await;
    let shop = key("shop", "web");
    fixture
        .traffic
        .publish(&route(&shop, backend("a").await, &[]))
        .await
        .expect("caddy accepts the acme policy");
    let policies: serde_json::Value = plain_client()
        .get(format!(
            "http://{}/config/apps/tls/automation/policies",
            fixture.caddy.admin_addr
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(policies[0]["subjects"][0], "web.shop.apps.example.test");
    assert_eq!(policies[0]["issuers"][0]["module"], "acme");
    assert_eq!(policies[0]["issuers"][0]["email"], "ops@example.test");
}

#[tokio::test]
async fn a_caddy_loaded_with_another_config_is_seen_without_stead_servers() {
    let fixture = fixture(TlsIssuer::Internal).await;
    assert!(fixture.traffic.servers_present().await.unwrap());
    // What `systemctl reload caddy` with another Caddyfile amounts to.
    let admin = &fixture.caddy.admin_addr;
    let loaded = plain_client()
        .post(format!("http://{admin}/load"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"admin": {{"listen": "{admin}"}}}}"#))
        .send()
        .await
        .unwrap();
    assert!(loaded.status().is_success(), "{loaded:?}");
    assert!(!fixture.traffic.servers_present().await.unwrap());
    assert_eq!(
        fixture.traffic.ensure_server().await.unwrap(),
        ServerCheck::Created
    );
    assert!(fixture.traffic.servers_present().await.unwrap());
}

/// A restarted daemon (a new adapter, the same Caddy) or a reloaded
/// catalog cannot know which public hosts Caddy's HTTPS routes were
/// published with: each route reads back as wrong once, so the pass
/// republishes it with today's hosts; a republication that changes
/// nothing writes nothing.
#[tokio::test]
async fn routes_read_back_as_wrong_once_after_a_restart_or_reload_then_as_held() {
    let fixture = fixture(TlsIssuer::Internal).await;
    let shop = key("shop", "web");
    let port = backend("a").await;
    let old = route(&shop, port, &["old.example.test"]);
    fixture.traffic.publish(&old).await.unwrap();
    let restarted = CaddyTraffic::new(fixture.traffic.config().clone()).unwrap();
    assert_eq!(restarted.held_routes().await.unwrap()[0].port, 0);
    // The catalog now says another host: republished, the old one gone.
    let new = route(&shop, port, &["new.example.test"]);
    restarted.publish(&new).await.unwrap();
    assert_eq!(restarted.held_routes().await.unwrap()[0].port, port);
    let response = get_https(&fixture, "new.example.test").await.unwrap();
    assert_eq!(response.text().await.unwrap(), "a");
    // A reload forgets; the same hosts again cost no write.
    restarted.forget_published_hosts();
    assert_eq!(restarted.held_routes().await.unwrap()[0].port, 0);
    let writes = restarted.route_writes();
    restarted.publish(&new).await.unwrap();
    assert_eq!(
        restarted.route_writes(),
        writes,
        "nothing changed, nothing written"
    );
    assert_eq!(restarted.held_routes().await.unwrap()[0].port, port);
}
