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

use crate::adapters::caddy::{CaddyConfig, CaddyTls, CaddyTraffic, TlsIssuer};
use crate::adapters::docker::{DockerConfig, DockerProvisioner, DockerRuntime, NativeRestart};
use crate::adapters::helm::{HelmConfig, HelmProvisioner};
use crate::adapters::probe::{NetAndLogProbe, NetProbe};
use crate::core::catalog::{reload_hazards, Catalog, CatalogChange, CatalogError, ReloadHazard};
use crate::core::event_log::{Event, EventKind};
use crate::core::policy::{reconciler_lease_ttl, LEASE_MARGIN};
use crate::core::types::{InstanceName, ServiceName};
use crate::engine::clock::AnchoredClock;
use crate::engine::event_log::{EventFlusher, EventSink, EVENT_BUFFER_MAX};
use crate::engine::lease::LeaseGuard;
use crate::engine::recovery::{DomainTable, InstanceLocks, ReadinessTable, Recoverer};
use crate::engine::tick::Reconciler;
use crate::engine::wake::{WakeQueue, WAKE_QUEUE_CAPACITY_DEFAULT};
use crate::engine::worker::{Worker, WorkerConfig};
use crate::engine::{Ports, SharedCatalog, SystemClock};
use crate::ports::{Notifier, NotifyError, Policy, PolicyError, Provisioner, Store};

pub mod admin;
pub mod allocator;
pub mod api;
pub mod caddy_watch;
pub mod event_log;
pub mod events;
pub mod flight;
pub mod human;
pub mod identity;
pub mod listener;
pub mod metrics;
pub mod page;
pub mod plan;
pub mod provisioners;
pub mod reserved_hosts;
pub use crate::engine::start_hazards;
pub use crate::engine::start_hazards::ReloadMode;
pub mod status;
pub mod telemetry;
pub mod webhooks;
pub mod why;

// The config parser needs no adapter and lives in `crate::config` so that it
// builds (and is fuzzed) without `io`; `daemon::config` stays its name here.
pub use crate::config::daemon as config;
pub use config::{DaemonConfig, DaemonConfigError, LogFormat};

/// How the daemon runs helm, from its `[helm]` settings.
pub fn helm_config(config: &DaemonConfig) -> HelmConfig {
    HelmConfig {
        helm_path: config.helm.path.clone(),
        kubectl_path: config.helm.kubectl_path.clone(),
        pod_security: config.grants.helm_pod_security(),
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
    /// The database has no stead schema, or an older one than this binary
    /// needs; `stead migrate` brings it up to date.
    #[error(
        "the database at {database} has no stead schema (or an older one): run `stead migrate`"
    )]
    NoSchema {
        /// The database's URL, without its password.
        database: String,
    },
    #[error(transparent)]
    AdminBind(#[from] admin::AdminBindError),
    #[error(transparent)]
    ApiBind(#[from] api::ApiBindError),
    /// `admin_token_file` cannot be read, or holds no usable token.
    #[error(transparent)]
    AdminToken(#[from] crate::config::admin_token::AdminTokenError),
    #[error(transparent)]
    TaskPanicked(#[from] TaskPanicked),
}

/// A loop of the daemon panicked: a bug, after which the process cannot be
/// trusted to keep its promises (a dead reconciler ticks no more, a dead
/// worker claims no more). The daemon exits non-zero so that its service
/// manager restarts it, rather than run on without the loop.
#[derive(Debug, thiserror::Error)]
#[error(
    "the daemon's {task} task panicked ({message}); stopping so the service manager restarts stead"
)]
pub struct TaskPanicked {
    /// The task's name: `reconciler`, `worker w0`, `admin`, ….
    pub task: String,
    /// The panic's message, when it was a string.
    pub message: String,
}

/// The daemon's loops, each with a name for the error that ends the
/// process when one of them panics.
#[derive(Default)]
pub struct Tasks {
    set: tokio::task::JoinSet<()>,
    names: std::collections::HashMap<tokio::task::Id, String>,
}

impl Tasks {
    pub fn spawn(
        &mut self,
        name: impl Into<String>,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name.into());
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits until `stop` turns true. A task that returns before is
    /// fine (the admin server after an accept error, say); a task that
    /// panics ends the wait at once with its name and message.
    pub async fn supervise(&mut self, mut stop: watch::Receiver<bool>) -> Result<(), TaskPanicked> {
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
                Some(joined) = self.set.join_next(), if !self.set.is_empty() => {
                    if let Err(error) = joined {
                        self.panicked(error)?;
                    }
                }
            }
        }
    }

    /// Waits for every task to end; a panic among them is an error, as
    /// in [`Tasks::supervise`].
    pub async fn drain(&mut self) -> Result<(), TaskPanicked> {
        while let Some(joined) = self.set.join_next().await {
            if let Err(error) = joined {
                self.panicked(error)?;
            }
        }
        Ok(())
    }

    pub fn abort_all(&mut self) {
        self.set.abort_all();
    }

    /// A cancelled task is no failure (only `abort_all` cancels); a
    /// panicked one is.
    fn panicked(&self, error: tokio::task::JoinError) -> Result<(), TaskPanicked> {
        if !error.is_panic() {
            return Ok(());
        }
        let task = self
            .names
            .get(&error.id())
            .cloned()
            .unwrap_or_else(|| "unnamed".to_owned());
        let panic = error.into_panic();
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        Err(TaskPanicked { task, message })
    }
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

/// Largest webhook secret file read: a key, not a blob.
pub const WEBHOOK_SECRET_LEN_MAX: u64 = 4096;

/// A delivery task per `[[webhooks]]` entry, each secret read from its
/// file now (a missing or unreadable one stops the start, naming the
/// field), delivering only while this replica leads.
fn webhook_notifiers(
    config: &DaemonConfig,
    ports: &Ports,
    reconciler: &Arc<Reconciler>,
) -> Result<Vec<Arc<webhooks::WebhookNotifier>>, DaemonError> {
    use crate::adapters::webhook::WebhookTarget;
    let pacing = webhooks::DeliveryPacing {
        gap_grace: config.event_gap_grace(),
        ..webhooks::DeliveryPacing::default()
    };
    let mut notifiers = Vec::with_capacity(config.webhooks.len());
    for (n, hook) in config.webhooks.iter().enumerate() {
        let secret = hook
            .secret_file
            .as_deref()
            .map(|path| read_webhook_secret(n, path))
            .transpose()?;
        let target = WebhookTarget {
            name: hook.name.clone(),
            url: hook.url.clone(),
            secret,
            format: hook.format,
            timeout: hook.timeout,
        };
        let leader = reconciler.clone();
        let notifier = webhooks::WebhookNotifier::new(
            ports.store.clone(),
            ports.clock.clone(),
            target,
            hook.kinds.clone(),
            pacing,
        )
        .map_err(|e| DaemonError::Setup(format!("webhooks[{n}] ({}): {e}", hook.name)))?
        .for_teams(hook.teams.clone())
        .gated(Arc::new(move || leader.leads()));
        notifiers.push(Arc::new(notifier));
    }
    Ok(notifiers)
}

/// A webhook's key, read as every config file is read (a regular file,
/// bounded), without its trailing newline; an empty one is refused.
fn read_webhook_secret(n: usize, path: &std::path::Path) -> Result<Vec<u8>, DaemonError> {
    let refused = |reason: String| {
        DaemonError::Setup(format!(
            "webhooks[{n}].secret_file = {:?}: {reason}",
            path.display()
        ))
    };
    let text = crate::config::read_bounded(path, WEBHOOK_SECRET_LEN_MAX)
        .map_err(|e| refused(e.to_string()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(refused("is empty; a webhook's key must not be".into()));
    }
    Ok(secret.as_bytes().to_vec())
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

/// The Caddy adapter's HTTPS from `[caddy.tls]`; `None` when off.
pub fn caddy_tls(settings: &config::TlsSettings) -> Option<CaddyTls> {
    let issuer = match settings.mode {
        config::TlsMode::Off => return None,
        config::TlsMode::Internal => TlsIssuer::Internal,
        config::TlsMode::Acme => TlsIssuer::Acme {
            email: settings.email.clone(),
            ca: settings.acme_ca.clone(),
        },
    };
    Some(CaddyTls {
        issuer,
        listen_addr: settings.listen.clone(),
        domain: settings.domain.clone(),
        hsts_max_age: settings.hsts_max_age,
    })
}

pub use crate::engine::recovery::domain_table;

/// Says once per load when the catalog names public host names that
/// nothing serves: `[caddy.tls]` is off.
fn warn_unserved_domains(config: &DaemonConfig, domains: &DomainTable) {
    if config.caddy.tls.mode == config::TlsMode::Off && !domains.is_empty() {
        let services: Vec<String> = domains
            .keys()
            .map(|(service_type, service)| format!("{service_type}/{service}"))
            .collect();
        tracing::warn!(
            services = %services.join(", "),
            "the catalog gives services public domains, but [caddy.tls] mode is off: they are not served (docs/operations.md, \"HTTPS and domains\")"
        );
    }
}

/// A catalog's Helm type whose helm calls would outlive the task lease.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("type {service_type} is provisioned by helm, but {reason}")]
pub struct HelmTimeoutsDisagree {
    pub service_type: String,
    #[source]
    pub reason: config::HelmLeaseTooShort,
}

/// A catalog with a Helm type needs a task lease that outlives a helm call
/// (`DaemonConfig::check_helm_timeouts`); a Docker-only one does not.
pub fn helm_timeouts_agree(
    config: &DaemonConfig,
    catalog: &Catalog,
) -> Result<(), HelmTimeoutsDisagree> {
    let Some(helm_type) = catalog.entries().find(|e| !e.is_docker()) else {
        return Ok(());
    };
    config
        .check_helm_timeouts()
        .map_err(|reason| HelmTimeoutsDisagree {
            service_type: helm_type.service_type.to_string(),
            reason,
        })
}

/// The process-wide Prometheus recorder; see [`metrics::handle`].
pub fn metrics_handle() -> metrics_exporter_prometheus::PrometheusHandle {
    metrics::handle()
}

/// Opens the store the config names. SQLite is migrated on open (zero
/// setup on one machine); Postgres is shared by several machines, so its
/// schema moves only by an explicit `stead migrate`, and one without the
/// schema this binary needs is refused ([`DaemonError::NoSchema`]) before
/// any query fails on a missing table.
pub async fn open_store(config: &DaemonConfig) -> Result<Arc<dyn Store>, DaemonError> {
    use crate::store::sql::{self, Backend};
    match Backend::of_url(&config.database_url)? {
        Backend::Sqlite => {
            ensure_state_dir(config)?;
            let store = sql::SqliteStore::connect(&config.database_url).await?;
            store.migrate().await?;
            Ok(Arc::new(store.with_settings(&config.database)))
        }
        Backend::Postgres => {
            let store =
                sql::PostgresStore::connect_with(&config.database_url, &config.database).await?;
            if sql::pending_migrations(&store).await? > 0 {
                return Err(DaemonError::NoSchema {
                    database: redact(&config.database_url),
                });
            }
            Ok(Arc::new(store))
        }
    }
}

/// Creates `state_dir` when the SQLite database lives in it (the default),
/// with the mode the process's umask gives (0700 under `stead`'s own).
pub fn ensure_state_dir(config: &DaemonConfig) -> Result<(), DaemonError> {
    let under_state_dir = config
        .database_url
        .contains(&*config.state_dir.to_string_lossy());
    if config.database_url.starts_with("sqlite:") && under_state_dir {
        std::fs::create_dir_all(&config.state_dir).map_err(|e| {
            DaemonError::Setup(format!(
                "state_dir = {:?}: cannot create: {e}",
                config.state_dir.display()
            ))
        })?;
    }
    Ok(())
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
        limits: config.limits.clone(),
        cap_drop: config.docker.cap_drop.clone(),
        isolation: config.docker.isolation,
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

/// What a reload applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// What changed, in service-type order.
    pub changes: Vec<CatalogChange>,
    /// The hazards a forced reload applied anyway (none when guarded).
    pub forced: Vec<ReloadHazard>,
}

/// Why a reload was refused; the running catalog is kept.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file is unreadable, invalid or asks for more than granted.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The file is valid but would damage live instances.
    #[error("{}", hazards_text(.0))]
    Hazards(Vec<ReloadHazard>),
    /// The store did not say which types have live instances, so nothing
    /// shows the reload is safe.
    #[error(
        "cannot read which service types have live instances ({0}); retry, or force the \
         reload with `stead reload --force`"
    )]
    Store(#[source] crate::ports::StoreError),
}

impl ReloadError {
    /// The hazards that refused the reload, if that is why.
    pub fn hazards(&self) -> &[ReloadHazard] {
        match self {
            Self::Hazards(hazards) => hazards,
            Self::Catalog(_) | Self::Store(_) => &[],
        }
    }
}

fn hazards_text(hazards: &[ReloadHazard]) -> String {
    let each: Vec<String> = hazards.iter().map(ToString::to_string).collect();
    format!(
        "{} change(s) would damage live instances: {}; undo them, or apply them anyway with \
         `stead reload --force`",
        hazards.len(),
        each.join("; ")
    )
}

/// How long a stopping daemon waits to write its last events.
const EVENT_FLUSH_AT_EXIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// Held by [`Daemon::reload_catalog`]: reloads run one at a time.
    reload_lock: tokio::sync::Mutex<()>,
    /// Writes what the loops log to the event log (#42): run by
    /// [`Daemon::run`], or once by [`Daemon::flush_events`].
    event_flusher: tokio::sync::Mutex<EventFlusher>,
    /// One delivery task per configured webhook (#42), run beside the
    /// reconciler and delivering while it leads.
    pub webhooks: Vec<Arc<webhooks::WebhookNotifier>>,
}

/// Refuses to start with a catalog a reload would refuse (#54): judged
/// against what live instances run ([`start_hazards`]), unless the
/// command line forced it. Fails closed: a store that cannot say is a
/// refusal too (the unit restarts the daemon).
async fn refuse_start_hazards(
    store: &dyn Store,
    config: &DaemonConfig,
    catalog: &Catalog,
) -> Result<(), DaemonError> {
    let mode = if config.force_catalog {
        ReloadMode::Forced
    } else {
        ReloadMode::Guarded
    };
    let file = config.catalog.display();
    match start_hazards::judge_start(store, catalog, &config.grants, mode, Default::default()).await
    {
        Ok(found) => {
            for why in &found.unjudged {
                tracing::warn!("catalog at start: {why}");
            }
            for hazard in &found.hazards {
                tracing::warn!("catalog forced at start: {hazard}");
            }
            Ok(())
        }
        Err(start_hazards::StartRefused::Store(e)) => Err(DaemonError::Setup(format!(
            "{file}: cannot judge whether it would damage live instances: {e}"
        ))),
        Err(start_hazards::StartRefused::Hazards(found)) => {
            for why in &found.unjudged {
                tracing::warn!("catalog at start: {why}");
            }
            Err(DaemonError::Setup(format!(
                "{file}: refused at start, as a reload would be: {}. Start with `stead run \
                 --force-catalog` to apply it anyway",
                hazards_text(&found.hazards)
            )))
        }
    }
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
        refuse_start_hazards(store.as_ref(), &config, &catalog.current()).await?;
        let docker = docker_runtime(&config).await?;
        let caddy = CaddyTraffic::new(CaddyConfig {
            admin_addr: config.caddy.admin.clone(),
            server_name: config.caddy.server_name.clone(),
            listen_addr: config.caddy.listen.clone(),
            host_suffix: config.caddy.host_suffix.clone(),
            request_timeout: config.caddy.request_timeout,
            tls: caddy_tls(&config.caddy.tls),
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
                NetProbe::new().map_err(|e| DaemonError::Setup(e.to_string()))?,
                docker.clone(),
            )),
            policy: Arc::new(CatalogPolicy::new(catalog.clone(), store)),
            provisioner,
            notifier: Arc::new(LogNotifier),
        };
        // Their trust is timed by the engine's clock: its monotonic clock
        // and the host's wall clock (#41).
        let locks = Arc::new(InstanceLocks::new(ports.store.clone()).timed_by(ports.clock.clone()));
        let holder = identity.process.holder();
        let lease = Arc::new(
            LeaseGuard::new(
                holder.clone(),
                reconciler_lease_ttl(control.tick_interval, config.recovery.instance_deadline),
                LEASE_MARGIN,
            )
            .timed_by(ports.clock.clone()),
        );
        let recoverer = Arc::new(Recoverer::new(
            ports.clone(),
            config.recovery.clone(),
            readiness_table(&catalog.current()),
            locks.clone(),
            identity.process.actor("recovery"),
            lease,
        ));
        recoverer.set_helm_types(catalog.current().helm_types());
        let domains = domain_table(&catalog.current());
        warn_unserved_domains(&config, &domains);
        recoverer.set_domains(domains);
        let reconciler = Arc::new(Reconciler::new(
            ports.clone(),
            catalog.clone(),
            control,
            recoverer.clone(),
            os_seed(),
        ));
        let wake = Arc::new(WakeQueue::new(WAKE_QUEUE_CAPACITY_DEFAULT));
        recoverer.wake_at_requested_times(wake.clone());
        let (events, event_flusher) = EventSink::new(holder.clone(), EVENT_BUFFER_MAX);
        recoverer.log_events_to(events);
        recoverer.trace_targeted_passes(os_seed());
        if config.flight_recorder.enabled {
            record_passes(&recoverer, &config.flight_recorder);
        }
        reconciler.keep_events_for(config.events.retention);
        let webhooks = webhook_notifiers(&config, &ports, &reconciler)?;
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
            reload_lock: tokio::sync::Mutex::new(()),
            event_flusher: tokio::sync::Mutex::new(event_flusher),
            webhooks,
        })
    }

    /// Writes what the event log's buffer holds now (`stead tick`, `run
    /// --once`, and after the loops stopped); the number written. Bounded,
    /// so a database that no longer answers cannot hold the exit.
    pub async fn flush_events(&self) -> usize {
        let flushed = tokio::time::timeout(EVENT_FLUSH_AT_EXIT_MAX, async {
            let mut flusher = self.event_flusher.lock().await;
            flusher.flush(self.ports.store.as_ref()).await
        })
        .await;
        flushed.unwrap_or_else(|_| {
            tracing::warn!("the last events were not written: the database did not answer");
            0
        })
    }

    /// Sets each webhook's cursor before any loop logs an event (so a new
    /// webhook is sent everything from this start on), then runs one
    /// delivery task per webhook.
    async fn spawn_webhooks(&self, tasks: &mut Tasks, stop: &watch::Receiver<bool>) {
        for webhook in &self.webhooks {
            if let Err(e) = webhook.start_cursor().await {
                tracing::warn!(webhook = webhook.name(), error = %e, "webhook cursor not set yet; its task tries again");
            }
            let webhook = webhook.clone();
            let stop = stop.clone();
            tasks.spawn(format!("webhook {}", webhook.name()), async move {
                webhook.run(stop).await
            });
        }
    }

    /// T1: this identity's earlier incarnations at this site are gone (the
    /// identity lock this process holds says so), so the instance locks
    /// they held are released and the tasks their workers held running are
    /// queued again at once, rather than left to expire: a daemon killed
    /// mid-upgrade and restarted resumes the upgrade within a tick, not
    /// after the task lease (#40). A twin's (the same identity at another
    /// site: a copied `state_dir`) may be alive, and are left to expire.
    pub async fn reclaim_predecessor_work(&self) {
        let prefix = self.identity.process.predecessors_prefix();
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
    /// valid and safe for the instances running, makes every loop use it:
    /// the next tick plans upgrades to its versions (woken now rather than
    /// after its pause), workers create from its specs, grants and
    /// readiness probes follow it. A bad file, or one asking for a host
    /// path, secret or variable `stead.toml`'s `[grants]` do not give (the
    /// grants this daemon started with), is refused with its error and the
    /// running catalog kept. So is, unless `mode` is
    /// [`ReloadMode::Forced`], one that would damage live instances
    /// ([`reload_hazards`]), or one whose hazards cannot be known because
    /// the store does not answer. Returns what changed.
    ///
    /// Reloads run one at a time, so each is compared with the catalog it
    /// replaces.
    pub async fn reload_catalog(&self, mode: ReloadMode) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let path = &self.config.catalog;
        let result = match self.load_for_reload() {
            Ok(new) => self
                .check_hazards(&new, mode)
                .await
                .map(|forced| (new, forced)),
            Err(e) => Err(ReloadError::Catalog(e)),
        };
        let (new, forced) = match result {
            Ok(checked) => checked,
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
        let domains = domain_table(&new);
        warn_unserved_domains(&self.config, &domains);
        self.recoverer.set_domains(domains);
        // The next pass republishes every route with the new catalog's
        // public hosts (a route whose hosts did not change writes nothing).
        self.caddy.forget_published_hosts();
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
        self.recoverer.events().emit(Event::new(
            EventKind::CatalogReload,
            self.ports.clock.now(),
            if forced.is_empty() {
                "reload"
            } else {
                "reload --force"
            },
            format!("catalog reloaded: {summary}"),
        ));
        ::metrics::counter!("stead_catalog_reloads_total", "result" => "ok").increment(1);
        self.reconciler.wake();
        Ok(Reloaded { changes, forced })
    }

    /// The catalog file, valid against the grants and the Helm timeouts.
    fn load_for_reload(&self) -> Result<Catalog, CatalogError> {
        let path = &self.config.catalog;
        let catalog = crate::config::load_catalog(path, &self.config.grants)?;
        helm_timeouts_agree(&self.config, &catalog).map_err(|reason| CatalogError::Read {
            file: path.display().to_string(),
            reason: reason.to_string(),
        })?;
        Ok(catalog)
    }

    /// The hazards of replacing the running catalog with `new`: an error
    /// when guarded, the ones forced (each logged) when forced.
    async fn check_hazards(
        &self,
        new: &Catalog,
        mode: ReloadMode,
    ) -> Result<Vec<ReloadHazard>, ReloadError> {
        let live_types = match (self.ports.store.live_service_types().await, mode) {
            (Ok(types), _) => types,
            (Err(e), ReloadMode::Guarded) => return Err(ReloadError::Store(e)),
            (Err(e), ReloadMode::Forced) => {
                tracing::warn!(error = %e, "forced catalog reload: the store did not say which types have live instances; reloading without checking");
                return Ok(Vec::new());
            }
        };
        let hazards = reload_hazards(&self.catalog.current(), new, &live_types);
        match mode {
            ReloadMode::Guarded if !hazards.is_empty() => Err(ReloadError::Hazards(hazards)),
            ReloadMode::Guarded => Ok(Vec::new()),
            ReloadMode::Forced => {
                for hazard in &hazards {
                    tracing::warn!("forced catalog reload: {hazard}");
                }
                Ok(hazards)
            }
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
        .with_events(self.recoverer.events().clone())
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
    ///
    /// Fails at once when the admin token file cannot be read or the admin
    /// port cannot be taken, and as soon as
    /// any loop panics (the others are abandoned as at the shutdown bound):
    /// either way the process must exit non-zero.
    pub async fn run(
        self: &Arc<Self>,
        role: Role,
        stop: watch::Receiver<bool>,
    ) -> Result<(), DaemonError> {
        let admin_token = match &self.config.admin_token_file {
            Some(path) => Some(crate::config::admin_token::AdminToken::read(path)?),
            None => None,
        };
        let admin_listener = match self.config.admin_listen {
            Some(addr) => Some(admin::bind(addr).await?),
            None => None,
        };
        let api_listener = match self.config.tenancy.api.listen {
            Some(addr) => Some(api::bind(addr).await?),
            None => None,
        };
        self.reclaim_predecessor_work().await;
        let mut tasks = Tasks::default();
        if role.reconciles() {
            self.spawn_webhooks(&mut tasks, &stop).await;
        }
        {
            let daemon = self.clone();
            let stop = stop.clone();
            tasks.spawn("event log", async move {
                let mut flusher = daemon.event_flusher.lock().await;
                flusher.run(daemon.ports.store.as_ref(), stop).await;
            });
        }
        if let Some(listener) = admin_listener {
            let daemon = self.clone();
            let stop = stop.clone();
            tasks.spawn("admin", async move {
                admin::serve(daemon, listener, role, admin_token, stop).await
            });
        }
        if let Some(listener) = api_listener {
            let state = api::ApiState::of_daemon(self);
            let stop = stop.clone();
            tasks.spawn("tenant API", api::serve(state, listener, stop));
        }
        if role.reconciles() {
            if let Some(warning) = crate::adapters::caddy::host_reload_warning() {
                tracing::warn!("{warning}");
            }
            // stead's server in Caddy is created by the first pass, under
            // the lease: a standby writes nothing to Caddy (#41).
            let daemon = self.clone();
            let stop_r = stop.clone();
            tasks.spawn(
                "reconciler",
                async move { daemon.reconciler.run(stop_r).await },
            );
            {
                let daemon = self.clone();
                let stop = stop.clone();
                tasks.spawn("caddy watch", caddy_watch::run(daemon, stop));
            }
            events::spawn_drainers(self, &mut tasks, &stop);
            if self.config.docker_events {
                events::spawn_follower(self, &mut tasks, &stop);
            }
        }
        if role.works() {
            for n in 0..self.config.workers {
                let worker = self.worker(n);
                let stop_w = stop.clone();
                tasks.spawn(
                    format!("worker w{n}"),
                    async move { worker.run(stop_w).await },
                );
            }
        }
        if let Err(panicked) = tasks.supervise(stop.clone()).await {
            tracing::error!("{panicked}");
            tasks.abort_all();
            return Err(panicked.into());
        }
        tracing::info!(grace = ?self.config.shutdown_grace, "stopping: no new claims; waiting for handlers");
        let drained = tokio::time::timeout(self.config.shutdown_grace, tasks.drain()).await;
        match drained {
            Ok(Ok(())) => {}
            Ok(Err(panicked)) => {
                tracing::error!("{panicked}");
                tasks.abort_all();
                return Err(panicked.into());
            }
            Err(_) => {
                tracing::warn!("shutdown bound reached; abandoning handlers (their task leases expire and requeue)");
                tasks.abort_all();
            }
        }
        // What the handlers logged while they finished.
        self.flush_events().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Query parameters of a database URL whose value is a secret (libpq's
/// and sqlx's spellings), compared without case.
const SECRET_URL_PARAMETERS: [&str; 4] = ["password", "sslpassword", "pass", "pwd"];

/// The database URL without its passwords, for logs and status: the user
/// information (`user:pass@`) and the value of every password parameter
/// of the query (`?password=…`). When in doubt it hides too much: an `@`
/// in a query value hides everything before it.
pub fn redact(url: &str) -> String {
    let (head, rest) = match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            (format!("{}://…@", &url[..scheme_end]), &url[at + 1..])
        }
        _ => (String::new(), url),
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{head}{rest}");
    };
    let query = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _))
                if SECRET_URL_PARAMETERS
                    .iter()
                    .any(|secret| key.eq_ignore_ascii_case(secret)) =>
            {
                format!("{key}=…")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{head}{path}?{query}")
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

/// `[flight_recorder]`: every instance pass recorded for `stead replay`.
/// A directory it cannot make leaves the daemon running unrecorded, said.
fn record_passes(recoverer: &Recoverer, settings: &crate::config::daemon::FlightRecorderSettings) {
    match flight::recorder(settings) {
        Ok(recorder) => {
            recoverer.watch_passes(Arc::new(recorder));
            tracing::info!(
                dir = %settings.dir.display(),
                passes_per_instance = settings.passes_per_instance,
                "the flight recorder records every instance pass (`stead replay FILE`)"
            );
        }
        Err(e) => {
            ::metrics::counter!("stead_flight_recorder_dropped_total").increment(1);
            tracing::warn!(
                dir = %settings.dir.display(),
                "the flight recorder is off: its directory cannot be used: {e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn redact_hides_passwords_in_the_user_information_and_the_query() {
        for (url, shown) in [
            (
                "postgres://stead:hunter2@db.example/stead",
                "postgres://…@db.example/stead",
            ),
            (
                "postgres://host/db?password=secret&sslmode=require",
                "postgres://host/db?password=…&sslmode=require",
            ),
            (
                "postgres://host/db?user=x&password=y",
                "postgres://host/db?user=x&password=…",
            ),
            (
                "postgres://u:p@host/db?sslmode=require&PassWord=y&sslpassword=z",
                "postgres://…@host/db?sslmode=require&PassWord=…&sslpassword=…",
            ),
            (
                "sqlite:///var/lib/stead/stead.db?mode=rwc",
                "sqlite:///var/lib/stead/stead.db?mode=rwc",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn redact_never_shows_a_query_password_holding_an_at_sign() {
        let shown = redact("postgres://host/db?password=a@b&sslmode=require");
        assert!(
            !shown.contains("a@b") && !shown.contains("password=a"),
            "{shown}"
        );
    }

    /// Bound on a test's wait for supervision to end; it ends at once.
    const SUPERVISE_WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_panicking_loop_ends_supervision_with_its_name_and_message() {
        let (_stop_tx, stop) = watch::channel(false);
        let mut tasks = Tasks::default();
        tasks.spawn("worker w0", std::future::pending());
        tasks.spawn("reconciler", async {
            let broken: Option<u32> = None;
            // A broken invariant in the loop, as `assert!` would report it.
            assert!(broken.is_some(), "invariant broken in the tick");
        });
        let error = tokio::time::timeout(SUPERVISE_WAIT, tasks.supervise(stop))
            .await
            .expect("a panic ends supervision at once, not at stop")
            .expect_err("a panic is an error");
        assert_eq!(error.task, "reconciler");
        assert!(
            error.message.contains("invariant broken in the tick"),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("the daemon's reconciler task panicked"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_loop_that_returns_before_stop_is_no_failure() {
        let (stop_tx, stop) = watch::channel(false);
        let mut tasks = Tasks::default();
        tasks.spawn("admin", async {});
        tasks.spawn("reconciler", std::future::pending());
        let supervised = tokio::spawn(async move { tasks.supervise(stop).await });
        tokio::task::yield_now().await;
        stop_tx.send(true).expect("supervision listens");
        let result = tokio::time::timeout(SUPERVISE_WAIT, supervised)
            .await
            .expect("stop ends supervision")
            .expect("supervision does not panic");
        assert!(result.is_ok(), "{result:?}");
    }
}
