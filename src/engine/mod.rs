//! The engine: a thin async interpreter that drives the pure core over the
//! ports. It sequences commands, applies deadlines and locks, and aggregates
//! errors; it makes no policy decision of its own.

use std::sync::{Arc, RwLock};

use crate::core::catalog::Catalog;
use crate::core::types::Timestamp;
use crate::ports::{Clock, Notifier, Policy, Probe, Provisioner, Runtime, Store, Traffic};

pub mod clock;
pub(crate) mod drive;
pub mod event_log;
pub mod events;
pub mod flight;
pub mod lease;
pub mod locks;
pub mod recovery;
pub mod replay;
pub mod start_hazards;
pub mod tick;
pub mod trace;
pub mod wake;
pub mod worker;

/// Every port the engine talks through.
#[derive(Clone)]
pub struct Ports {
    pub clock: Arc<dyn Clock>,
    pub runtime: Arc<dyn Runtime>,
    pub traffic: Arc<dyn Traffic>,
    pub store: Arc<dyn Store>,
    pub probe: Arc<dyn Probe>,
    pub policy: Arc<dyn Policy>,
    pub provisioner: Arc<dyn Provisioner>,
    pub notifier: Arc<dyn Notifier>,
}

/// The wall clock. Under madsim `SystemTime::now` is virtual, so the same
/// clock serves the daemon and the simulation.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The one place stead reads the wall clock.
    fn now(&self) -> Timestamp {
        Timestamp::try_from(std::time::SystemTime::now()).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// The catalog the loops read, replaceable while they run (`stead reload`,
/// SIGHUP). Each tick and each task takes the current one once and uses it
/// throughout, so a reload never changes a catalog under a running step.
#[derive(Clone, Debug, Default)]
pub struct SharedCatalog(Arc<RwLock<Arc<Catalog>>>);

impl SharedCatalog {
    pub fn new(catalog: Arc<Catalog>) -> Self {
        Self(Arc::new(RwLock::new(catalog)))
    }

    pub fn current(&self) -> Arc<Catalog> {
        // A poisoned lock still holds a whole `Arc`: swapping it cannot be
        // half done.
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs `catalog`, returning the one it replaces.
    pub fn replace(&self, catalog: Arc<Catalog>) -> Arc<Catalog> {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *current, catalog)
    }
}

impl From<Arc<Catalog>> for SharedCatalog {
    fn from(catalog: Arc<Catalog>) -> Self {
        Self::new(catalog)
    }
}

/// `stead_port_errors_total{port, kind}`: every failure a port reported,
/// by what kind it was.
pub(crate) fn count_port_failure(
    port: crate::core::errors::PortName,
    kind: crate::core::errors::ErrorKind,
) {
    metrics::counter!(
        "stead_port_errors_total",
        "port" => port.as_str(),
        "kind" => kind.as_str()
    )
    .increment(1);
}

/// How long from `now` until the instant `at` a machine named, on the
/// engine's clock; zero when it has passed.
pub(crate) fn time_until(
    at: crate::core::types::Timestamp,
    now: crate::core::types::Timestamp,
) -> std::time::Duration {
    std::time::Duration::try_from(at.duration_since(now)).unwrap_or_default()
}
