//! What a service should look like: the catalog's description of one
//! workload, as the provisioner creates it and the probes verify it.
//! Plain data; loading and validation live in `core::catalog`.

use std::time::Duration;

use super::types::ServiceName;

/// How to decide a backend is ready to take traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadinessProbe {
    /// No probe: readiness is assumed once the container runs.
    None,
    /// An HTTP GET on the bind of `port` must answer 2xx or 3xx.
    Http {
        port: u16,
        path: String,
        timeout: Duration,
        interval: Duration,
        attempts_max: u32,
    },
    /// A TCP connect to the bind of `port` must succeed.
    Tcp {
        port: u16,
        timeout: Duration,
        interval: Duration,
        attempts_max: u32,
    },
}

/// A container-level healthcheck, run by the runtime itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Healthcheck {
    /// Argument vector run inside the container (never a shell string).
    pub command: Vec<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub retries: u32,
}

/// One workload of a catalog service type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: ServiceName,
    pub image: String,
    /// Command override (argument vector); empty keeps the image's default.
    pub command: Vec<String>,
    /// Container ports published on loopback ephemeral host ports.
    pub ports: Vec<u16>,
    pub healthcheck: Option<Healthcheck>,
    pub readiness: ReadinessProbe,
    pub stop_grace: Duration,
}
