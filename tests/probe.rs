//! Readiness probes against real loopback listeners.

mod support_services;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stead::adapters::probe::NetProbe;
use stead::core::spec::ReadinessProbe;
use stead::core::types::{Binds, ContainerId};
use stead::ports::{Probe, ProbeError, ProbeTarget};
use support_services::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CONTAINER_PORT: u16 = 8080;

/// A loopback HTTP server whose `n`th request (from 1) is answered with
/// `status(n)`, after `delay`. Returns its port and the request counter.
async fn server(status: fn(u32) -> u16, delay: Duration) -> (u16, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicU32::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                tokio::time::sleep(delay).await;
                let code = status(n);
                let response = format!(
                    "HTTP/1.1 {code} X\r\nlocation: /elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (port, count)
}

fn http(attempts_max: u32) -> ReadinessProbe {
    ReadinessProbe::Http {
        port: CONTAINER_PORT,
        path: "/healthz".to_owned(),
        timeout: Duration::from_millis(500),
        interval: Duration::from_millis(50),
        attempts_max,
    }
}

fn tcp(attempts_max: u32) -> ReadinessProbe {
    ReadinessProbe::Tcp {
        port: CONTAINER_PORT,
        timeout: Duration::from_millis(500),
        interval: Duration::from_millis(50),
        attempts_max,
    }
}

/// Some execution of some container: a network probe dials only its binds.
fn target_with(binds: Binds) -> ProbeTarget {
    ProbeTarget {
        container: ContainerId::new("c1"),
        started_at: None,
        binds,
    }
}

fn target(host_port: u16) -> ProbeTarget {
    target_with(Binds::from([(CONTAINER_PORT, host_port)]))
}

#[tokio::test]
async fn http_2xx_and_3xx_are_ready() {
    let probe = NetProbe::new().unwrap();
    let (ok, _) = server(|_| 200, Duration::ZERO).await;
    let (redirect, _) = server(|_| 302, Duration::ZERO).await;
    assert_eq!(probe.ready(&http(1), &target(ok)).await, Ok(()));
    assert_eq!(probe.ready(&http(1), &target(redirect)).await, Ok(()));
}

#[tokio::test]
async fn http_5xx_is_retried_up_to_the_attempts_then_fails() {
    let probe = NetProbe::new().unwrap();
    let (port, count) = server(|_| 503, Duration::ZERO).await;
    let error = probe.ready(&http(3), &target(port)).await.unwrap_err();
    assert_eq!(
        count.load(Ordering::SeqCst),
        3,
        "exactly attempts_max tries"
    );
    assert!(matches!(error, ProbeError::NotReady(_)), "{error:?}");
    assert!(error.to_string().contains("after 3 attempt(s)"), "{error}");
    assert!(error.to_string().contains("503"), "{error}");
}

#[tokio::test]
async fn http_becomes_ready_on_a_later_attempt() {
    let probe = NetProbe::new().unwrap();
    let (port, count) = server(|n| if n < 3 { 500 } else { 200 }, Duration::ZERO).await;
    assert_eq!(probe.ready(&http(5), &target(port)).await, Ok(()));
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_slow_http_answer_times_out() {
    let probe = NetProbe::new().unwrap();
    let (port, _) = server(|_| 200, Duration::from_secs(3)).await;
    let error = probe.ready(&http(1), &target(port)).await.unwrap_err();
    assert!(matches!(error, ProbeError::Unreachable(_)), "{error:?}");
    assert!(
        error.to_string().contains("not ready after 1 attempt(s)"),
        "{error}"
    );
}

#[tokio::test]
async fn tcp_connect_is_ready_and_a_closed_port_is_not() {
    let probe = NetProbe::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap().port();
    assert_eq!(probe.ready(&tcp(1), &target(open)).await, Ok(()));
    let error = probe
        .ready(&tcp(2), &target(free_port()))
        .await
        .unwrap_err();
    assert!(matches!(error, ProbeError::Unreachable(_)), "{error:?}");
    assert!(error.to_string().contains("after 2 attempt(s)"), "{error}");
}

#[tokio::test]
async fn a_port_missing_from_the_binds_is_a_clear_error() {
    let probe = NetProbe::new().unwrap();
    let other = target_with(Binds::from([(9090, 40000)]));
    for readiness in [http(1), tcp(1)] {
        let error = probe.ready(&readiness, &other).await.unwrap_err();
        assert!(matches!(error, ProbeError::Misconfigured(_)), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("readiness port 8080 has no bind"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn no_probe_is_ready_and_a_bad_path_is_refused() {
    let probe = NetProbe::new().unwrap();
    assert_eq!(
        probe
            .ready(&ReadinessProbe::None, &target_with(Binds::new()))
            .await,
        Ok(())
    );
    let bad = ReadinessProbe::Http {
        port: CONTAINER_PORT,
        path: "healthz".to_owned(),
        timeout: Duration::from_millis(100),
        interval: Duration::ZERO,
        attempts_max: 1,
    };
    let error = probe.ready(&bad, &target(1)).await.unwrap_err();
    assert!(matches!(error, ProbeError::Misconfigured(_)), "{error:?}");
    assert!(error.to_string().contains("path = \"healthz\""), "{error}");
}
