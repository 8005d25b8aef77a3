//! The real adapters: each implements one port over a real service and adds
//! no policy of its own. They translate, validate what comes back (bad input
//! becomes an error that names the field and the value, never a panic) and
//! map failures onto the ports' error types.
//!
//! | port | adapter | talks to |
//! | --- | --- | --- |
//! | `Runtime` | [`docker::DockerRuntime`] | Docker Engine API on a unix socket (Podman's compatible socket works the same) |
//! | `Provisioner` | [`docker::DockerProvisioner`] | the same Docker socket (the embedded default) |
//! | `Provisioner` | [`helm::HelmProvisioner`] | the `helm` binary, as a subprocess with argument vectors |
//! | `Traffic` | [`caddy::CaddyTraffic`] | Caddy's admin API on loopback |
//! | `Probe` | [`probe::NetAndLogProbe`] | HTTP and TCP on loopback binds ([`probe::NetProbe`]); log lines of one execution through the Docker socket |
//! | (the event log) | [`webhook::WebhookClient`] | a webhook receiver over HTTP(S): one signed POST per event (#42) |
//!
//! Built only with the `io` feature and never under madsim: the simulation
//! uses the in-memory ports.

pub mod caddy;
pub mod docker;
pub mod helm;
pub mod probe;
pub mod read_cache;
pub mod webhook;
