//! #43 end to end, on real dockerd and Caddy with Caddy's internal issuer
//! (no ACME CA is reachable here): an instance served over HTTPS on its
//! catalog domain, trusted through the root Caddy's admin API gives
//! (`/pki/ca/local`) as `curl --cacert` would, with the name resolved to
//! loopback; a request loop over HTTPS sees no failure across an upgrade
//! (a route change); HTTP is redirected to HTTPS; and a Caddy that lost
//! its config (reloaded with another one, as `systemctl reload caddy`
//! with another Caddyfile does) is republished within seconds, not at the
//! next tick.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{inspect, wait_until, Harness, Setup};
use support_services::docker::Cleanup;
use support_services::{free_port, unique};

const CONVERGE: Duration = Duration::from_secs(60);
/// The catalog's public name of an instance.
const DOMAIN_TEMPLATE: &str = "{instance}.shop.test";

fn public_host(instance: &str) -> String {
    DOMAIN_TEMPLATE.replace("{instance}", instance)
}

/// The e2e catalog at `version`, its service given the public domain.
fn catalog(version: &str) -> String {
    let doc = e2e::catalog(version, e2e::HTTPD);
    let with = doc.replacen(
        "ports = [8080]\n",
        &format!("ports = [8080]\ndomains = [\"{DOMAIN_TEMPLATE}\"]\n"),
        1,
    );
    assert_ne!(with, doc, "the service table takes `domains`");
    with
}

/// HTTPS with the internal issuer on a free loopback port.
fn setup(tick_interval_s: u64) -> (Setup, u16) {
    let https_port = free_port();
    let setup = Setup {
        catalog: catalog("1"),
        tick_interval_s,
        extra_config: format!(
            "[caddy.tls]\nmode = \"internal\"\nlisten = \"127.0.0.1:{https_port}\"\n\
             domain = \"apps.test\"\nhsts_max_age_s = 60\n"
        ),
        ..Setup::default()
    };
    (setup, https_port)
}

/// A client that trusts only the root of Caddy's local CA, resolves
/// `host` to the HTTPS server on loopback, and opens a fresh connection
/// per request (a Caddy reload closes idle keep-alive connections, which
/// is the host's business, not stead's; see `e2e_daemon.rs`).
async fn https_client(h: &Harness, host: &str, https_port: u16) -> reqwest::Client {
    let ca: serde_json::Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{}/pki/ca/local", h.caddy.admin_addr))
        .send()
        .await
        .expect("caddy's admin API answers")
        .json()
        .await
        .expect("json");
    let pem = ca["root_certificate"].as_str().expect("a local root");
    reqwest::Client::builder()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
        .resolve(host, ([127, 0, 0, 1], https_port).into())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// GET `https://host/`: the status, or why there is none.
async fn get_https(client: &reqwest::Client, host: &str, https_port: u16) -> Result<u16, String> {
    client
        .get(format!("https://{host}:{https_port}/"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// GETs over HTTPS in a loop until `stop`, every 20 ms; any answer but
/// 200 is a failure. Returns the failures and the number of requests.
fn request_loop(
    client: reqwest::Client,
    host: String,
    https_port: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(Vec<String>, u32)> {
    tokio::spawn(async move {
        let (mut failures, mut total) = (Vec::new(), 0);
        while !*stop.borrow() {
            total += 1;
            match get_https(&client, &host, https_port).await {
                Ok(200) => {}
                Ok(status) => failures.push(format!("request {total}: {status}")),
                Err(why) => failures.push(format!("request {total}: {why}")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (failures, total)
    })
}

/// Zero-downtime route changes hold only where Caddy's reloads reset
/// nothing (docs/operations.md, "Caddy reloads").
fn assert_host_keeps_connections_across_caddy_reloads() {
    if let Some(warning) = stead::adapters::caddy::host_reload_warning() {
        panic!("{warning}; run `scripts/services up` (it sets it) or `sysctl -w net.ipv4.tcp_migrate_req=1`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_served_over_https_on_its_domain_and_an_upgrade_fails_no_tls_request() {
    assert_host_keeps_connections_across_caddy_reloads();
    let name = unique("e2etls");
    let _cleanup = Cleanup::new(&name);
    let (setup, https_port) = setup(1);
    let mut h = Harness::start(setup).await;
    h.create(&name, None).await;
    let host = public_host(&name);
    let client = https_client(&h, &host, https_port).await;
    wait_until("served over https", CONVERGE, || async {
        get_https(&client, &host, https_port).await == Ok(200)
    })
    .await;
    // The default scheme's name is served too, under the same CA.
    let default_host = format!("{}.{name}.apps.test", e2e::SERVICE);
    let default_client = https_client(&h, &default_host, https_port).await;
    wait_until("served under the default scheme", CONVERGE, || async {
        get_https(&default_client, &default_host, https_port).await == Ok(200)
    })
    .await;
    // HTTP of the public name is redirected to HTTPS.
    let redirect = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("http://{}/", h.listen))
        .header("host", &host)
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 308);
    assert_eq!(
        redirect.headers()["location"],
        format!("https://{host}:{https_port}/").as_str()
    );
    let old = h.active_container(&name).await.expect("active");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let requests = request_loop(client, host.clone(), https_port, stop_rx);
    // A new version: the next tick plans the upgrade, whose switch moves
    // the HTTPS route to the successor's bind.
    h.restart_with_catalog(&catalog("2")).await;
    wait_until("upgraded and predecessor retired", 2 * CONVERGE, || async {
        let new = h.active_container(&name).await;
        new.is_some_and(|n| n != old) && inspect(&old, "{{.Id}}").is_err()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send(true).unwrap();
    let (failures, total) = requests.await.unwrap();
    assert!(total > 10, "the loop ran ({total} requests)");
    assert!(
        failures.is_empty(),
        "{} of {total} HTTPS requests failed during the upgrade: {failures:#?}",
        failures.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caddy_that_lost_its_config_is_republished_within_seconds_not_a_tick() {
    /// Far longer than the test: only the watcher can bring the routes
    /// back in time.
    const TICK_S: u64 = 300;
    /// The watcher's default interval, plus a pass.
    const BACK_WITHIN: Duration = Duration::from_secs(2 + 5);
    let name = unique("e2elost");
    let _cleanup = Cleanup::new(&name);
    let (setup, https_port) = setup(TICK_S);
    let h = Harness::start(setup).await;
    h.create(&name, None).await;
    // With a long tick, the provision's container is published by the
    // pass Docker's start event triggers (a targeted pass, which does not
    // read the plane back: only the watcher can notice the loss below).
    wait_until("served", CONVERGE, || async { h.get(&name).await == 200 }).await;
    let host = public_host(&name);
    let client = https_client(&h, &host, https_port).await;
    wait_until("served over https", CONVERGE, || async {
        get_https(&client, &host, https_port).await == Ok(200)
    })
    .await;
    // No event of the container is still to come, so no targeted pass
    // publishes (which would recreate the servers) after the loss.
    let id = h.active_container(&name).await.expect("active");
    wait_until("healthy", CONVERGE, || async {
        inspect(&id, "{{.State.Health.Status}}").as_deref() == Ok("healthy")
    })
    .await;
    let recreated_before = h.daemon().caddy.servers_created();
    let missed_before = h.daemon().caddy.servers_missed();
    // What `systemctl reload caddy` with another Caddyfile amounts to: a
    // whole new config, without stead's servers.
    let admin = &h.caddy.admin_addr;
    let loaded = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{admin}/load"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"admin": {{"listen": "{admin}"}}}}"#))
        .send()
        .await
        .unwrap();
    assert!(loaded.status().is_success(), "{loaded:?}");
    let took = wait_until("every route back", Duration::from_secs(60), || async {
        h.get(&name).await == 200 && get_https(&client, &host, https_port).await == Ok(200)
    })
    .await;
    assert!(
        took <= BACK_WITHIN,
        "routes back after {took:?}, not within {BACK_WITHIN:?} (the tick is {TICK_S} s)"
    );
    // That Caddy had lost them is proven by stead having had to create
    // its servers again.
    assert!(
        h.daemon().caddy.servers_created() > recreated_before,
        "Caddy did not lose its config: the test proved nothing"
    );
    assert!(
        h.daemon().caddy.servers_missed() > missed_before,
        "the watcher never saw the loss: something else republished"
    );
}
