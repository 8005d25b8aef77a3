//! The production daemon's wiring: config, ports, the reconciler, workers,
//! Docker's event stream, the admin endpoints and shutdown. The `stead`
//! binary is a thin CLI over this module, so every piece here is testable
//! in-process (see `tests/e2e_daemon.rs`).
//!
//! **Architecture invariant:** nothing here decides anything about
//! workloads. It builds the engine's ports from config and runs the engine's
//! loops; every decision stays in `core`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::adapters::caddy::{CaddyConfig, CaddyTraffic, ServerCheck};
use crate::adapters::docker::{DockerConfig, DockerProvisioner, DockerRuntime, NativeRestart};
use crate::adapters::helm::{HelmConfig, HelmProvisioner};
use crate::adapters::probe::{NetAndLogProbe, NetProbe};
use crate::core::catalog::{Catalog, CatalogChange, CatalogError};
use crate::core::policy::{reconciler_lease_ttl, LEASE_MARGIN};
use crate::core::types::{InstanceName, ServiceName};
use crate::engine::clock::AnchoredClock;
use crate::engine::lease::LeaseGuard;
use crate::engine::recovery::{InstanceLocks, ReadinessTable, Recoverer};
use crate::engine::tick::Reconciler;
use crate::engine::wake::{WakeQueue, WAKE_QUEUE_CAPACITY_DEFAULT};
use crate::engine::worker::{Worker, WorkerConfig};
use crate::engine::{Ports, SharedCatalog, SystemClock};
use crate::ports::{Notifier, NotifyError, Policy, PolicyError, Provisioner, Store};

pub mod admin;
pub mod allocator;
pub mod events;
pub mod human;
pub mod identity;
pub mod metrics;
pub mod provisioners;
pub mod status;

// The config parser needs no adapter and lives in `crate::config` so that it
// builds (and is fuzzed) without `io`; `daemon::config` stays its name here.
pub use crate::config::daemon as config;
pub use config::{DaemonConfig, DaemonConfigError, LogFormat};

/// How the daemon runs helm, from its `[helm]` settings.
pub fn helm_config(config: &DaemonConfig) -> HelmConfig {
    HelmConfig {
        helm_path: config.helm.path.clone(),
        wait_timeout: config.helm.wait_timeout,
        kill_margin: config.helm.kill_margin,
        pass_env: config.helm.pass_env.clone(),
        env: config
            .helm
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// Which loops this process runs (`stead run --role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The singleton reconciler (ticks, recovery, events) only.
    Reconciler,
    /// Workers only: claim and run tasks from the shared queue.
    Worker,
    /// Both, in one process: the single-machine default.
    All,
}

impl Role {
    pub fn reconciles(self) -> bool {
        matches!(self, Role::Reconciler | Role::All)
    }
    pub fn works(self) -> bool {
        matches!(self, Role::Worker | Role::All)
    }
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] DaemonConfigError),
    #[error(transparent)]
    Catalog(#[from] crate::core::catalog::CatalogError),
    #[error(transparent)]
    Store(#[from] crate::ports::StoreError),
    #[error("{0}")]
    Setup(String),
}

/// Grants checks (R11): the catalog is the grant list. An instance may run
/// a service while its service type is in the catalog and lists that
/// service; an operator revokes a service by removing it from the catalog,
/// and recovery then refuses to start or restart it (fail closed, the
/// traffic withdrawn) instead of reviving what is no longer granted. Binds
/// are loopback ephemeral ports and no devices are passed through, so there
/// is nothing finer to grant.
pub struct CatalogPolicy {
    catalog: SharedCatalog,
    store: Arc<dyn Store>,
}

impl CatalogPolicy {
    /// Grants follow the catalog as it is now: a reload that removes a
    /// service revokes it at the next check.
    pub fn new(catalog: impl Into<SharedCatalog>, store: Arc<dyn Store>) -> Self {
        Self {
            catalog: catalog.into(),
            store,
        }
    }
}

#[async_trait]
impl Policy for CatalogPolicy {
    async fn check(
        &self,
        instance: &InstanceName,
        service: &ServiceName,
    ) -> Result<(), PolicyError> {
        let row = self
            .store
            .instance(instance)
            .await
            .map_err(|e| PolicyError::Unavailable(format!("grants of {instance}: {e}")))?
            .ok_or_else(|| {
                PolicyError::Revoked(format!("grants of {instance}: no such instance"))
            })?;
        let catalog = self.catalog.current();
        let entry = catalog.get(&row.service_type).ok_or_else(|| {
            PolicyError::Revoked(format!(
                "{instance}: service type {:?} is not in the catalog; nothing of it is granted",
                row.service_type
            ))
        })?;
        if entry.services.iter().any(|s| &s.name == service) {
            Ok(())
        } else {
            Err(PolicyError::Revoked(format!(
                "{instance}: service {service} is not in the catalog's {:?}; its grant was revoked",
                row.service_type
            )))
        }
    }
}

/// Notifications go to the log (at warn, so they stand out); a chat or
/// mail notifier can replace it behind the same port.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogNotifier;

#[async_trait]
impl Notifier for LogNotifier {
    async fn notify(&self, event: &str, message: &str) -> Result<(), NotifyError> {
        tracing::warn!(event, "{message}");
        ::metrics::counter!("stead_notifications_total", "event" => event.to_owned()).increment(1);
        Ok(())
    }
}

/// The readiness probe of every (service type, service) in the catalog.
pub fn readiness_table(catalog: &Catalog) -> ReadinessTable {
    let mut table = BTreeMap::new();
    for entry in catalog.entries() {
        for spec in &entry.services {
            table.insert(
                (entry.service_type.clone(), spec.name.clone()),
                spec.readiness.clone(),
            );
        }
    }
    table
}

/// A catalog with a Helm type needs a task lease that outlives a helm call
/// (`DaemonConfig::check_helm_timeouts`); a Docker-only one does not.
pub fn helm_timeouts_agree(config: &DaemonConfig, catalog: &Catalog) -> Result<(), String> {
    let Some(helm_type) = catalog.entries().find(|e| !e.is_docker()) else {
        return Ok(());
    };
    config.check_helm_timeouts().map_err(|reason| {
        format!(
            "type {} is provisioned by helm, but {reason}",
            helm_type.service_type
        )
    })
}

/// The process-wide Prometheus recorder; see [`metrics::handle`].
pub fn metrics_handle() -> metrics_exporter_prometheus::PrometheusHandle {
    metrics::handle()
}

/// Opens the store the config names. SQLite is migrated on open (zero
/// setup on one machine); Postgres is shared by several machines, so its
/// schema moves only by an explicit `stead migrate`.
pub async fn open_store(config: &DaemonConfig) -> Result<Arc<dyn Store>, DaemonError> {
    use crate::store::sql::{self, Backend};
    match Backend::of_url(&config.database_url)? {
        Backend::Sqlite => {
            if config
                .database_url
                .contains(&*config.state_dir.to_string_lossy())
            {
                std::fs::create_dir_all(&config.state_dir).map_err(|e| {
                    DaemonError::Setup(format!(
                        "state_dir = {:?}: cannot create: {e}",
                        config.state_dir.display()
                    ))
                })?;
            }
            Ok(sql::connect_and_migrate(&config.database_url).await?)
        }
        Backend::Postgres => Ok(sql::connect(&config.database_url).await?),
    }
}

/// A Docker client. Tries to negotiate the API version; when dockerd does
/// not answer yet the client is built anyway (it dials per request), so the
/// daemon starts, keeps ticking and recovers once the engine is back.
pub async fn docker_runtime(config: &DaemonConfig) -> Result<DockerRuntime, DaemonError> {
    let docker_config = DockerConfig {
        socket_path: config.docker.socket.clone(),
        request_timeout: config.docker.request_timeout,
        native_restart: if config.docker.restart_unless_stopped {
            NativeRestart::UnlessStopped
        } else {
            NativeRestart::Never
        },
        ..DockerConfig::default()
    };
    match DockerRuntime::connect(docker_config.clone()).await {
        Ok(runtime) => Ok(runtime),
        Err(e) => {
            tracing::warn!(error = %e, "docker did not answer at start; carrying on");
            DockerRuntime::new(docker_config).map_err(|e| DaemonError::Setup(e.to_string()))
        }
    }
}

/// Everything a running daemon is made of.
pub struct Daemon {
    pub config: DaemonConfig,
    /// The catalog every loop reads; [`Daemon::reload_catalog`] replaces it.
    pub catalog: SharedCatalog,
    pub ports: Ports,
    pub docker: DockerRuntime,
    pub caddy: CaddyTraffic,
    pub locks: Arc<InstanceLocks>,
    pub recoverer: Arc<Recoverer>,
    pub reconciler: Arc<Reconciler>,
    /// This process as lease holder and worker: `<identity>#<incarnation>`.
    pub holder: String,
    /// The identity of the state directory, held while the daemon lives.
    pub identity: identity::Identity,
    /// Instances woken for recovery before the next tick (T7).
    pub wake: Arc<WakeQueue>,
}

impl Daemon {
    /// Loads the catalog, opens the store and builds every port.
    pub async fn build(config: DaemonConfig) -> Result<Daemon, DaemonError> {
        let loaded = crate::config::load_catalog(&config.catalog, &config.grants)?;
        helm_timeouts_agree(&config, &loaded).map_err(|reason| {
            DaemonError::Setup(format!("{}: {reason}", config.catalog.display()))
        })?;
        let catalog = SharedCatalog::new(Arc::new(loaded));
        let identity = identity::Identity::take(&config.state_dir, os_seed())
            .await
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let store = open_store(&config).await?;
        let docker = docker_runtime(&config).await?;
        let caddy = CaddyTraffic::new(CaddyConfig {
            admin_addr: config.caddy.admin.clone(),
            server_name: config.caddy.server_name.clone(),
            listen_addr: config.caddy.listen.clone(),
            host_suffix: config.caddy.host_suffix.clone(),
            request_timeout: config.caddy.request_timeout,
        })
        .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let control = config.control.clone();
        let helm = HelmProvisioner::new(helm_config(&config))
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let provisioner: Arc<dyn Provisioner> = Arc::new(provisioners::RoutedProvisioner::new(
            Arc::new(DockerProvisioner::new(docker.clone())),
            Arc::new(helm),
            catalog.clone(),
        ));
        let ports = Ports {
            clock: Arc::new(AnchoredClock::new(Arc::new(SystemClock))),
            runtime: Arc::new(docker.clone()),
            traffic: Arc::new(caddy.clone()),
            store: store.clone(),
            probe: Arc::new(NetAndLogProbe::new(
                NetProbe::new().map_err(DaemonError::Setup)?,
                docker.clone(),
            )),
            policy: Arc::new(CatalogPolicy::new(catalog.clone(), store)),
            provisioner,
            notifier: Arc::new(LogNotifier),
        };
        let locks = Arc::new(InstanceLocks::new(ports.store.clone()));
        let holder = identity.process.holder();
        let lease = Arc::new(LeaseGuard::new(
            holder.clone(),
            reconciler_lease_ttl(control.tick_interval, config.recovery.instance_deadline),
            LEASE_MARGIN,
        ));
        let recoverer = Arc::new(Recoverer::new(
            ports.clone(),
            config.recovery.clone(),
            readiness_table(&catalog.current()),
            locks.clone(),
            identity.process.actor("recovery"),
            lease,
        ));
        recoverer.set_helm_types(catalog.current().helm_types());
        let reconciler = Arc::new(Reconciler::new(
            ports.clone(),
            catalog.clone(),
            control,
            recoverer.clone(),
            os_seed(),
        ));
        let wake = Arc::new(WakeQueue::new(WAKE_QUEUE_CAPACITY_DEFAULT));
        recoverer.wake_at_requested_times(wake.clone());
        Ok(Daemon {
            config,
            catalog,
            ports,
            docker,
            caddy,
            locks,
            recoverer,
            reconciler,
            holder,
            identity,
            wake,
        })
    }

    /// T1: this identity's earlier incarnation is gone (the identity lock
    /// says so), so the instance locks it held are released and the tasks
    /// its workers held running are queued again at once, rather than left
    /// to expire: a daemon killed mid-upgrade and restarted resumes the
    /// upgrade within a tick, not after the task lease (#40).
    pub async fn reclaim_predecessor_work(&self) {
        let prefix = self.identity.process.identity_prefix();
        match self
            .ports
            .store
            .requeue_tasks_of(&prefix, self.ports.clock.now())
            .await
        {
            Ok(tasks) if tasks.is_empty() => {}
            Ok(tasks) => tracing::info!(
                requeued = ?tasks,
                identity = %self.identity.process.identity,
                "queued again the tasks this daemon's previous run held (T1)"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not queue again the previous run's tasks; their leases will expire (C6)")
            }
        }
        match self.ports.store.clear_instance_locks_of(&prefix).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                released = n,
                identity = %self.identity.process.identity,
                "released instance locks of this daemon's previous run"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not release the previous run's instance locks; they will expire")
            }
        }
    }

    /// Reads and validates the catalog file again and, only if it is
    /// valid, makes every loop use it: the next tick plans upgrades to its
    /// versions (woken now rather than after its pause), workers create
    /// from its specs, grants and readiness probes follow it. A bad file,
    /// or one asking for a host path, secret or variable `stead.toml`'s
    /// `[grants]` do not give (the grants this daemon started with), is
    /// refused with its error and the running catalog kept. Returns what
    /// changed.
    pub fn reload_catalog(&self) -> Result<Vec<CatalogChange>, CatalogError> {
        let path = &self.config.catalog;
        let loaded = crate::config::load_catalog(path, &self.config.grants).and_then(|catalog| {
            helm_timeouts_agree(&self.config, &catalog)
                .map_err(|reason| CatalogError::Read {
                    file: path.display().to_string(),
                    reason,
                })
                .map(|()| catalog)
        });
        let new = match loaded {
            Ok(catalog) => catalog,
            Err(e) => {
                tracing::error!(
                    catalog = %path.display(),
                    "catalog reload refused, the running catalog is kept: {e}"
                );
                ::metrics::counter!("stead_catalog_reloads_total", "result" => "refused")
                    .increment(1);
                return Err(e);
            }
        };
        let changes = new.changes_from(&self.catalog.current());
        self.recoverer.set_readiness(readiness_table(&new));
        self.recoverer.set_helm_types(new.helm_types());
        self.catalog.replace(Arc::new(new));
        let summary = if changes.is_empty() {
            "no change".to_owned()
        } else {
            changes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        tracing::info!(catalog = %path.display(), "catalog reloaded: {summary}");
        ::metrics::counter!("stead_catalog_reloads_total", "result" => "ok").increment(1);
        self.reconciler.wake();
        Ok(changes)
    }

    /// Creates stead's server in Caddy if it is missing. Failure is not
    /// fatal: publication fails (and is retried) until Caddy answers.
    pub async fn ensure_caddy_server(&self) {
        match self.caddy.ensure_server().await {
            Ok(ServerCheck::Present) => {}
            Ok(ServerCheck::Created) => tracing::info!(
                admin = %self.config.caddy.admin,
                listen = %self.config.caddy.listen,
                "created stead's server in caddy"
            ),
            Ok(ServerCheck::ListenCorrected { was }) => tracing::warn!(
                admin = %self.config.caddy.admin,
                listen = %self.config.caddy.listen,
                was = ?was,
                "stead's caddy server listened elsewhere; corrected to the configured address"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                admin = %self.config.caddy.admin,
                "caddy server not ensured yet"
            ),
        }
    }

    fn worker(&self, n: u32) -> Worker {
        Worker::new(
            self.ports.clone(),
            self.catalog.clone(),
            WorkerConfig {
                id: self.identity.process.actor(&format!("w{n}")),
                lease: self.config.control.lease,
                retry: Default::default(),
                idle_poll: self.config.worker_idle_poll,
                stop_grace_default: self.config.recovery.stop_grace_default,
                broken: Default::default(),
            },
            self.locks.clone(),
        )
    }

    /// One worker claim-and-run, for `--once` and tests; `false` when no
    /// task was due.
    pub async fn work_once(&self) -> bool {
        self.worker(0).work_once().await.is_some()
    }

    /// Runs the loops of `role` until `stop` turns true, then shuts down
    /// within `shutdown_grace`: loops stop claiming, in-flight handlers may
    /// finish; what is still running after the bound is abandoned, and its
    /// task lease expires and requeues it (C6).
    pub async fn run(self: &Arc<Self>, role: Role, stop: watch::Receiver<bool>) {
        self.reclaim_predecessor_work().await;
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(addr) = self.config.admin_listen {
            let daemon = self.clone();
            let stop = stop.clone();
            tasks.spawn(async move { admin::serve(daemon, addr, role, stop).await });
        }
        if role.reconciles() {
            if let Some(warning) = crate::adapters::caddy::host_reload_warning() {
                tracing::warn!("{warning}");
            }
            self.ensure_caddy_server().await;
            let daemon = self.clone();
            let stop_r = stop.clone();
            tasks.spawn(async move { daemon.reconciler.run(stop_r).await });
            events::spawn_drainers(self, &mut tasks, &stop);
            if self.config.docker_events {
                events::spawn_follower(self, &mut tasks, &stop);
            }
        }
        if role.works() {
            for n in 0..self.config.workers {
                let worker = self.worker(n);
                let stop_w = stop.clone();
                tasks.spawn(async move { worker.run(stop_w).await });
            }
        }
        let mut stop_wait = stop.clone();
        while !*stop_wait.borrow() {
            if stop_wait.changed().await.is_err() {
                break;
            }
        }
        tracing::info!(grace = ?self.config.shutdown_grace, "stopping: no new claims; waiting for handlers");
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown bound reached; abandoning handlers (their task leases expire and requeue)");
            tasks.abort_all();
        }
        tracing::info!("stopped");
    }
}

/// The database URL without its password, for logs and status.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://…@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The seed of trace ids; drawn from the OS (the simulation passes its own).
pub fn os_seed() -> u64 {
    // std seeds each `RandomState` from the OS; hashing nothing with one
    // yields those random bits without another dependency.
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
