//! #54 end to end, on real dockerd and Caddy (HTTPS with Caddy's internal
//! issuer): a public host name is reserved for the instance that was
//! served under it first, until that instance is deleted. While the holder
//! is stopped (its route withdrawn), another instance of a type claiming
//! the same literal name is published without it: a request for that host
//! is never answered by the newcomer, which is still served under its own
//! loopback host, and the refusal is in the event log and `stead instance
//! why`, naming the holder.
//! Started again, the holder serves its host again.

mod e2e;
mod support;
mod support_services;

use std::time::Duration;

use e2e::{wait_until, Harness, Setup};
use stead::core::event_log::{EventFilter, EventKind};
use stead::core::types::InstanceName;
use support_services::docker::Cleanup;
use support_services::{free_port, unique};

const CONVERGE: Duration = Duration::from_secs(60);
/// How many times a refused host is asked, 100 ms apart: several
/// one-second ticks, each a chance for the newcomer's route to be
/// published again.
const WATCH_REQUESTS: u32 = 50;
/// A literal name: every instance of the type claims it.
const HOST: &str = "shop.names.test";
/// An httpd whose page is its container's hostname (Docker's default: the
/// container id's first 12 characters), so an answer names who gave it.
const HTTPD_NAMING_ITSELF: &str = "busybox rm -f /tmp/sick; mkdir -p /tmp/www; \
     hostname > /tmp/www/index.html; exec httpd -f -p 8080 -h /tmp/www";

/// The e2e catalog, its service given the literal public host.
fn catalog() -> String {
    let doc = e2e::catalog("1", HTTPD_NAMING_ITSELF);
    let with = doc.replacen(
        "ports = [8080]\n",
        &format!("ports = [8080]\ndomains = [\"{HOST}\"]\n"),
        1,
    );
    assert_ne!(with, doc, "the service table takes `domains`");
    with
}

/// A client that trusts only the root of Caddy's local CA and resolves
/// [`HOST`] to the HTTPS server on loopback.
async fn https_client(h: &Harness, https_port: u16) -> reqwest::Client {
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
        .resolve(HOST, ([127, 0, 0, 1], https_port).into())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// GET `https://HOST/`: the status and the page, or why there is none.
async fn get_host(client: &reqwest::Client, https_port: u16) -> Result<(u16, String), String> {
    let response = client
        .get(format!("https://{HOST}:{https_port}/"))
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status().as_u16();
    let page = response.text().await.map_err(|e| format!("{e:?}"))?;
    Ok((status, page.trim().to_owned()))
}

/// The hostname Docker gave the container ACTIVE names for `instance`.
async fn hostname_of(h: &Harness, instance: &str) -> String {
    let id = h
        .active_container(instance)
        .await
        .expect("an ACTIVE container");
    id[..12].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_host_is_never_served_for_another_instance_while_its_holder_is_down() {
    let holder = unique("e2eholder");
    let other = unique("e2eother");
    let _cleanup = (Cleanup::new(&holder), Cleanup::new(&other));
    let https_port = free_port();
    let mut h = Harness::start(Setup {
        catalog: catalog(),
        extra_config: format!(
            "[caddy.tls]\nmode = \"internal\"\nlisten = \"127.0.0.1:{https_port}\"\n"
        ),
        ..Setup::default()
    })
    .await;
    h.create(&holder, None).await;
    let client = https_client(&h, https_port).await;
    wait_until("the holder served under the host", CONVERGE, || async {
        h.get(&holder).await == 200
            && get_host(&client, https_port)
                .await
                .is_ok_and(|(s, _)| s == 200)
    })
    .await;
    let holder_name = hostname_of(&h, &holder).await;
    assert_eq!(
        get_host(&client, https_port).await,
        Ok((200, holder_name.clone()))
    );

    // The holder stops: its route, and with it the host's, is withdrawn.
    assert!(h.ops().set_stopped(&holder, true).await.expect("stop"));
    wait_until("the holder withdrawn", CONVERGE, || async {
        h.get(&holder).await != 200
            && get_host(&client, https_port).await.map(|(s, _)| s) != Ok(200)
    })
    .await;

    // Another instance of the type asks for the same host.
    h.create(&other, None).await;
    wait_until(
        "the other instance served on loopback",
        CONVERGE,
        || async { h.get(&other).await == 200 },
    )
    .await;
    let other_name = hostname_of(&h, &other).await;
    assert_ne!(other_name, holder_name);
    for _ in 0..WATCH_REQUESTS {
        let answer = get_host(&client, https_port).await;
        if let Ok((status, page)) = &answer {
            assert_ne!(page, &other_name, "{HOST} answered by {other}");
            assert_ne!(
                *status, 200,
                "{HOST} served while its holder is stopped: {answer:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refusals = h
        .daemon()
        .ports
        .store
        .events(&EventFilter {
            instance: Some(InstanceName::new(&other)),
            kind: Some(EventKind::HostRefused),
            ..EventFilter::default()
        })
        .await
        .expect("the event log reads");
    assert!(
        refusals
            .rows
            .iter()
            .any(|e| e.event.message.contains(HOST) && e.event.message.contains(&holder)),
        "no host_refused event naming {HOST} and {holder}: {:?}",
        refusals.rows
    );
    // One publication (two at most, should a Docker event's pass and a
    // tick's race), not one per tick: a route without its refused host is
    // what was published, so the traffic plane's read-back (T5) does not
    // take it for a changed route to publish again (each a Caddy reload).
    assert!(
        refusals.rows.len() <= 2,
        "{} refusals in {WATCH_REQUESTS} x 100 ms of one-second ticks: {:?}",
        refusals.rows.len(),
        refusals.rows
    );

    // The operator's view, from the database and the catalog alone.
    let (code, why) = e2e::stead_cli(&h.cli_config(), &["instance", "why", &other]);
    assert_eq!(code, 0, "{why}");
    assert!(
        why.contains(&format!(
            "is not served under {HOST}: the host is reserved for instance {holder}"
        )),
        "{why}"
    );

    // The holder starts again and serves its host again; the other one
    // keeps its loopback host and never gets the public one.
    assert!(h.ops().set_stopped(&holder, false).await.expect("start"));
    wait_until("the holder serves its host again", CONVERGE, || async {
        get_host(&client, https_port).await == Ok((200, holder_name.clone()))
    })
    .await;
    assert_eq!(h.get(&other).await, 200);
    for _ in 0..10 {
        assert_eq!(
            get_host(&client, https_port).await,
            Ok((200, holder_name.clone()))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.shutdown().await;
}
