//! The traffic port's contract, run against the in-memory double and the
//! real Caddy adapter alike: the same calls must get the same answers and
//! error kinds, and leave the same routes held (issue #44, "doubles that
//! cannot lie"). The double once accepted a route without binds that Caddy
//! refuses, so a service without ports failed every pass in production and
//! in no test (#40).

mod support_services;

use stead::adapters::caddy::{CaddyConfig, CaddyTraffic};
use stead::core::types::{Binds, ContainerId, ServiceKey};
use stead::ports::{PortFailure, Route, Traffic};
use stead_testkit::ports::{Hooks, MemoryTraffic};
use support_services::caddy::CaddyProcess;
use support_services::free_port;

/// One call of the contract.
enum Call {
    Publish(&'static str, Binds),
    Withdraw(&'static str),
    /// The routes held, as `service:port`, sorted.
    Held,
}

fn key(service: &str) -> ServiceKey {
    ServiceKey {
        instance: "contract".into(),
        service: service.into(),
    }
}

/// The calls, each with the answer every implementation must give: `ok`,
/// the error's kind, or the routes held.
fn contract() -> Vec<(Call, &'static str)> {
    use Call::*;
    vec![
        (Held, ""),
        (Publish("web", Binds::from([(8080, 31001)])), "ok"),
        (Held, "web:31001"),
        // A service without ports has no upstream to route to.
        (Publish("worker", Binds::new()), "refused"),
        // Port 0 is not a port (a row another tool wrote).
        (Publish("api", Binds::from([(8080, 0)])), "refused"),
        (Held, "web:31001"),
        // Publishing again moves the route: an idempotent upsert.
        (Publish("web", Binds::from([(8080, 31002)])), "ok"),
        (Held, "web:31002"),
        (Publish("api", Binds::from([(9090, 31003)])), "ok"),
        (Held, "api:31003 web:31002"),
        (Withdraw("web"), "ok"),
        // Withdrawing what is not there succeeds: safe to run twice.
        (Withdraw("web"), "ok"),
        (Withdraw("never-published"), "ok"),
        (Held, "api:31003"),
    ]
}

/// Runs the contract against `traffic`, returning each call's answer.
async fn run(traffic: &dyn Traffic) -> Vec<String> {
    let mut answers = Vec::new();
    for (call, _) in contract() {
        let answer = match call {
            Call::Publish(service, binds) => {
                let route = Route {
                    service: key(service),
                    container: ContainerId::new(format!("stead.contract.{service}.r1")),
                    binds,
                    verified_started_at: None,
                    public_hosts: Vec::new(),
                };
                match traffic.publish(&route).await {
                    Ok(()) => "ok".to_owned(),
                    Err(e) => e.kind().to_string(),
                }
            }
            Call::Withdraw(service) => match traffic.withdraw(&key(service)).await {
                Ok(()) => "ok".to_owned(),
                Err(e) => e.kind().to_string(),
            },
            Call::Held => {
                let mut held: Vec<String> = traffic
                    .held_routes()
                    .await
                    .expect("routes read back")
                    .into_iter()
                    .filter(|r| r.service.instance.as_str() == "contract")
                    .map(|r| format!("{}:{}", r.service.service, r.port))
                    .collect();
                held.sort();
                held.join(" ")
            }
        };
        answers.push(answer);
    }
    answers
}

fn expected() -> Vec<String> {
    contract()
        .into_iter()
        .map(|(_, answer)| answer.to_owned())
        .collect()
}

#[tokio::test]
async fn the_memory_double_keeps_the_traffic_contract() {
    let traffic = MemoryTraffic::new(Hooks::default());
    assert_eq!(run(&traffic).await, expected());
}

#[tokio::test]
async fn the_caddy_adapter_keeps_the_traffic_contract() {
    let caddy = CaddyProcess::start().await;
    let traffic = CaddyTraffic::new(CaddyConfig {
        admin_addr: caddy.admin_addr.clone(),
        listen_addr: format!("127.0.0.1:{}", free_port()),
        ..CaddyConfig::default()
    })
    .expect("client");
    traffic.ensure_server().await.expect("ensure server");
    assert_eq!(run(&traffic).await, expected());
}
