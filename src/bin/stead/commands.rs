//! One function per command. Each says what it did on standard output and
//! returns the exit status; an `Err` is printed by `main` and exits with
//! the status its kind maps to (`output.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::fleet::RolloutState;
use stead::daemon::admin::{
    CatalogView, ReloadAnswer, RELOAD_FORCE_QUERY, RELOAD_HEADER, RELOAD_HEADER_VALUE,
};
use stead::daemon::status::{
    render_instances, render_status, render_tasks, InstanceView, Status, StatusSources, TaskView,
};
use stead::daemon::{redact, Daemon, DaemonConfig, ReloadMode, Role};
use stead::engine::SystemClock;
use stead::ops::{CreateRequest, Deletion, Ops};
use stead::ports::{Clock, Store};

use crate::history::{by_operator, record};
use crate::output::{complain, say, say_json, CliError, EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::{config_source, Command, InstanceCommand, RoleArg, RolloutCommand, TaskCommand};
use stead::core::event_log::EventKind;
use stead::core::types::InstanceName;

/// Bound on a call to the running daemon's admin endpoint.
pub(crate) const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on the best-effort look at a running daemon by `stead check`.
const CHECK_ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn dispatch(command: Command, config: DaemonConfig) -> Result<u8, CliError> {
    match command {
        Command::Run {
            role,
            once,
            force_catalog,
        } => {
            let config = DaemonConfig {
                force_catalog,
                ..config
            };
            run(config, role, once).await
        }
        Command::Tick => tick(config).await,
        Command::Migrate => migrate(&config).await,
        Command::Backup { file, force } => backup(&config, &file, force).await,
        Command::Restore { file, force } => restore(&config, &file, force).await,
        Command::Check => check(&config).await,
        Command::Plan { json }
        | Command::Reload {
            plan: true, json, ..
        } => crate::plan::plan(&config, json).await,
        Command::Reload { force, .. } => {
            let mode = if force {
                ReloadMode::Forced
            } else {
                ReloadMode::Guarded
            };
            reload(&config, mode).await
        }
        Command::Status { json, live, team } => status(&config, json, live, team).await,
        Command::Instance(command) => instance(&config, command).await,
        Command::Task(TaskCommand::List { all, limit, json }) => {
            task_list(&config, all, limit, json).await
        }
        Command::Task(TaskCommand::Cancel { id }) => task_cancel(&config, id).await,
        Command::Rollout(command) => rollout(&config, command).await,
        Command::Token(command) => crate::tokens::token(&config, command).await,
        Command::Events {
            instance,
            team,
            kind,
            since,
            limit,
            follow,
            json,
        } => {
            let query = crate::history::EventQuery {
                instance,
                team,
                kind,
                since,
                limit,
            };
            crate::history::events(&config, query, follow, json).await
        }
        Command::Timeline { name, since, limit } => {
            crate::history::timeline(&config, &name, since, limit).await
        }
        Command::Replay { file } => replay(&file),
    }
}

/// `stead replay FILE`: 0 the same decisions and every rule kept, 1 a
/// divergence or a rule the recorded decisions broke, 2 a file that is
/// not a recording.
fn replay(file: &Path) -> Result<u8, CliError> {
    let unreadable = |message: String| CliError {
        message,
        code: EXIT_USAGE,
    };
    let recording = std::fs::read_to_string(file)
        .map_err(|e| unreadable(format!("{}: cannot be read: {e}", file.display())))?;
    let replayed = stead::engine::replay::replay(&recording)
        .map_err(|e| unreadable(format!("{}: {e}", file.display())))?;
    let (passes, steps) = (replayed.passes, replayed.steps);
    let file = file.display();
    match &replayed.divergence {
        None => say(format!(
            "replayed {passes} pass(es), {steps} step(s) of {file}: same decisions"
        )),
        Some(divergence) => say(format!(
            "replayed {passes} pass(es), {steps} step(s) of {file} with the same decisions, \
             then: {divergence}"
        )),
    }
    match replayed.broken.len() {
        0 => say("every recorded decision kept the rules"),
        n => {
            say(format!("{n} recorded pass(es) broke a rule:"));
            for broken in &replayed.broken {
                say(format!("  {broken}"));
            }
        }
    }
    let clean = replayed.divergence.is_none() && replayed.broken.is_empty();
    Ok(if clean { EXIT_OK } else { EXIT_FAILURE })
}

async fn run(config: DaemonConfig, role: RoleArg, once: bool) -> Result<u8, CliError> {
    let role = match role {
        RoleArg::Reconciler => Role::Reconciler,
        RoleArg::Worker => Role::Worker,
        RoleArg::All => Role::All,
    };
    let daemon = Arc::new(Daemon::build(config).await?);
    tracing::info!(
        holder = %daemon.holder,
        database = %redact(&daemon.config.database_url),
        catalog = %daemon.config.catalog.display(),
        "stead starting"
    );
    if once {
        let mut ok = true;
        if role.reconciles() {
            ok = daemon.reconciler.tick().await.ok();
            daemon.reconciler.release_lease().await;
        }
        if role.works() {
            // Bounded: at most this many tasks, then exit.
            for _ in 0..1000 {
                if !daemon.work_once().await {
                    break;
                }
            }
        }
        daemon.flush_events().await;
        return Ok(if ok { EXIT_OK } else { EXIT_FAILURE });
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signals = daemon.clone();
    tokio::spawn(async move {
        handle_signals(&signals).await;
        tracing::info!("signal received; shutting down");
        let _ = stop_tx.send(true);
    });
    daemon.run(role, stop_rx).await.map_err(|e| e.to_string())?;
    Ok(EXIT_OK)
}

/// Returns on SIGTERM or SIGINT; reloads the catalog on each SIGHUP.
async fn handle_signals(daemon: &Daemon) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut hangup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(term), Ok(hangup)) => (term, hangup),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM and SIGHUP; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading the catalog");
                // Refusals are logged by the reload itself. A signal never
                // forces: a reload that would damage live instances takes
                // `stead reload --force`.
                let _ = daemon.reload_catalog(ReloadMode::Guarded).await;
            }
        }
    }
}

async fn tick(config: DaemonConfig) -> Result<u8, CliError> {
    let daemon = Daemon::build(config).await?;
    let outcome = daemon.reconciler.tick().await;
    daemon.reconciler.release_lease().await;
    daemon.flush_events().await;
    for (check, why) in &outcome.failed {
        complain(&format!("check {} failed: {why}", check.as_str()));
    }
    if !outcome.leader {
        say("tick: another replica holds the reconciler lease; nothing was checked");
    } else {
        say(format!(
            "tick: {} task(s) enqueued, {} check(s) failed",
            outcome.tasks_enqueued,
            outcome.failed.len()
        ));
    }
    Ok(if outcome.ok() { EXIT_OK } else { EXIT_FAILURE })
}

async fn migrate(config: &DaemonConfig) -> Result<u8, CliError> {
    stead::daemon::ensure_state_dir(config).map_err(|e| e.to_string())?;
    let migrated = stead::store::sql::migrate(&config.database_url)
        .await
        .map_err(|e| e.to_string())?;
    let database = redact(&config.database_url);
    if migrated.applied.is_empty() {
        say(format!(
            "{database}: schema up to date ({} migration(s), none applied now)",
            migrated.known
        ));
    } else {
        for (version, description) in &migrated.applied {
            say(format!("applied migration {version} {description}"));
        }
        say(format!(
            "{database}: {} migration(s) applied; schema up to date",
            migrated.applied.len()
        ));
    }
    Ok(EXIT_OK)
}

async fn backup(config: &DaemonConfig, file: &Path, force: bool) -> Result<u8, CliError> {
    let copied = stead::store::sql::backup::backup(&config.database_url, file, force).await?;
    say(format!(
        "backed up {} to {}: {} instance(s), schema {}, {} bytes",
        redact(&config.database_url),
        copied.file.display(),
        copied.instances,
        copied.schema,
        copied.bytes
    ));
    Ok(EXIT_OK)
}

async fn restore(config: &DaemonConfig, file: &Path, force: bool) -> Result<u8, CliError> {
    let copied = stead::store::sql::backup::restore(&config.database_url, file, force).await?;
    for version in &copied.migrated {
        say(format!("applied migration {version} to the restored copy"));
    }
    say(format!(
        "restored {} from {}: {} instance(s), schema {}; start the daemon again",
        redact(&config.database_url),
        file.display(),
        copied.instances,
        copied.schema
    ));
    Ok(EXIT_OK)
}

/// What `stead run` would refuse at start: the catalog's changes that
/// would damage live instances, judged against the recorded definitions
/// of the versions they run (`daemon::start_hazards`). `false` when there
/// are any. The database is opened read-only, so `check` never creates
/// one; none yet (or none reachable) means nothing to judge, said so.
async fn judge_against_live_instances(config: &DaemonConfig, catalog: &Catalog) -> bool {
    let url = read_only(&config.database_url);
    let store = match stead::store::sql::connect_with(&url, &config.database).await {
        Ok(store) => store,
        Err(e) => {
            say(format!(
                "note: database {} not opened ({e}); the catalog was not judged against live                  instances (the daemon judges it at start)",
                redact(&config.database_url)
            ));
            return true;
        }
    };
    match stead::daemon::start_hazards::start_hazards(store.as_ref(), catalog, &config.grants).await
    {
        Ok(found) => {
            for why in &found.unjudged {
                say(format!("warning: {why}"));
            }
            for hazard in &found.hazards {
                complain(&format!(
                    "{}: {hazard}; `stead run` refuses it without --force-catalog",
                    config.catalog.display()
                ));
            }
            found.hazards.is_empty()
        }
        Err(e) => {
            complain(&format!(
                "database {}: cannot say which instances live ({e}); the catalog was not judged",
                redact(&config.database_url)
            ));
            false
        }
    }
}

/// A SQLite URL that opens the file read-only (so a missing file stays
/// missing); any other URL as it is.
fn read_only(url: &str) -> String {
    if !url.starts_with("sqlite:") {
        return url.to_owned();
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut params: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("mode="))
        .collect();
    params.push("mode=ro");
    format!("{base}?{}", params.join("&"))
}

async fn check(config: &DaemonConfig) -> Result<u8, CliError> {
    say(format!("config {}: ok", config_source(config)));
    if let Some(warning) = stead::adapters::caddy::host_reload_warning() {
        say(format!("warning: {warning}"));
    }
    let catalog = match stead::config::load_catalog(&config.catalog, &config.grants) {
        Ok(catalog) => catalog,
        Err(e) => {
            complain(&e.to_string());
            return Ok(EXIT_FAILURE);
        }
    };
    // What the daemon would refuse at start (or on reload) with this
    // catalog: a Helm type whose calls outlive the task lease.
    if let Err(reason) = stead::daemon::helm_timeouts_agree(config, &catalog) {
        complain(&format!("{}: {reason}", config.catalog.display()));
        return Ok(EXIT_FAILURE);
    }
    let versions: Vec<String> = catalog
        .entries()
        .map(|e| format!("{} {}", e.service_type, e.version))
        .collect();
    say(format!(
        "catalog {}: ok ({} service types: {})",
        config.catalog.display(),
        catalog.len(),
        versions.join(", ")
    ));
    if !judge_against_live_instances(config, &catalog).await {
        return Ok(EXIT_FAILURE);
    }
    // Best effort: a running daemon keeps the catalog it loaded until it
    // is told to reload, and nothing else would say so.
    if let Some(running) = running_catalog(config).await {
        let file = CatalogView::of(&config.catalog, &catalog);
        if running.versions != file.versions || running.file != file.file {
            say(format!(
                "note: the daemon answering on {} runs catalog {} ({}); this file differs: run \
                 `stead reload` (or send it SIGHUP) to apply it",
                config
                    .admin_listen
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                running.file,
                versions_text(&running.versions)
            ));
        }
    }
    Ok(EXIT_OK)
}

fn versions_text(versions: &BTreeMap<String, String>) -> String {
    versions
        .iter()
        .map(|(t, v)| format!("{t} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A client for the daemon's admin endpoints; with `admin_token_file`
/// set, every request presents its token (the daemon then demands it).
pub(crate) fn admin_client(
    config: &DaemonConfig,
    timeout: Duration,
) -> Result<reqwest::Client, CliError> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(path) = &config.admin_token_file {
        let token = stead::config::admin_token::AdminToken::read(path)
            .map_err(|e| CliError::from(e.to_string()))?;
        let mut value = reqwest::header::HeaderValue::from_bytes(&token.header_value())
            .map_err(|e| CliError::from(format!("admin_token_file: {e}")))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .default_headers(headers)
        .build()
        .map_err(|e| CliError::from(format!("http client: {e}")))
}

/// A 401 from the daemon: it demands a token this config does not give.
pub(crate) fn refuse_unauthorized(
    response: &reqwest::Response,
    endpoint: &str,
) -> Result<(), CliError> {
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return Ok(());
    }
    Err(format!(
        "{endpoint}: refused (401): the daemon demands its admin token; set admin_token_file in \
         this stead.toml to the daemon's token file"
    )
    .into())
}

/// The admin endpoint's base URL, or why there is none.
pub(crate) fn admin_url(config: &DaemonConfig) -> Result<String, CliError> {
    config
        .admin_listen
        .map(|a| format!("http://{a}"))
        .ok_or_else(|| {
            CliError::from(
                "the admin endpoints are off (admin_listen = \"\"); send the daemon SIGHUP \
                 instead"
                    .to_owned(),
            )
        })
}

async fn running_catalog(config: &DaemonConfig) -> Option<CatalogView> {
    let url = admin_url(config).ok()?;
    let client = admin_client(config, CHECK_ADMIN_TIMEOUT).ok()?;
    let response = client.get(format!("{url}/catalog")).send().await.ok()?;
    response.json::<CatalogView>().await.ok()
}

async fn reload(config: &DaemonConfig, mode: ReloadMode) -> Result<u8, CliError> {
    let url = admin_url(config)?;
    let endpoint = match mode {
        ReloadMode::Guarded => format!("{url}/reload"),
        ReloadMode::Forced => format!("{url}/reload?{RELOAD_FORCE_QUERY}"),
    };
    let response = admin_client(config, ADMIN_TIMEOUT)?
        .post(endpoint)
        .header(RELOAD_HEADER, RELOAD_HEADER_VALUE)
        .send()
        .await
        .map_err(|e| format!("no daemon answered on {url} ({e}); is `stead run` running?"))?;
    refuse_unauthorized(&response, &format!("{url}/reload"))?;
    if response.status() == reqwest::StatusCode::FORBIDDEN {
        let why = response.text().await.unwrap_or_default();
        return Err(format!("{url}/reload: refused (403): {}", why.trim_end()).into());
    }
    let answer: ReloadAnswer = response
        .json()
        .await
        .map_err(|e| format!("{url}/reload: unexpected answer: {e}"))?;
    if let Some(error) = answer.error {
        if answer.hazards.is_empty() {
            complain(&format!(
                "reload refused; the daemon keeps catalog {}: {error}",
                versions_text(&answer.catalog.versions)
            ));
        } else {
            complain(&format!(
                "reload refused; the daemon keeps catalog {}: these changes would damage live \
                 instances:",
                versions_text(&answer.catalog.versions)
            ));
            for hazard in &answer.hazards {
                complain(&format!("  {hazard}"));
            }
            complain("undo them in the file, or apply them anyway with `stead reload --force`");
        }
        return Ok(EXIT_FAILURE);
    }
    for hazard in &answer.hazards {
        say(format!("forced: {hazard}"));
    }
    if answer.changes.is_empty() {
        say(format!(
            "reloaded {}: no change ({})",
            answer.catalog.file,
            versions_text(&answer.catalog.versions)
        ));
    } else {
        say(format!("reloaded {}:", answer.catalog.file));
        for change in &answer.changes {
            say(format!("  {change}"));
        }
        say("upgrades to new versions are planned at the next tick (now)");
    }
    Ok(EXIT_OK)
}

async fn status(
    config: &DaemonConfig,
    json: bool,
    live: bool,
    team: Option<String>,
) -> Result<u8, CliError> {
    let mut status = if live {
        live_status(config).await?
    } else {
        local_status(config).await?
    };
    if let Some(team) = team {
        // The rows name instances, not teams: keep those of the team's.
        let store = stead::daemon::open_store(config).await?;
        let names: std::collections::BTreeSet<String> = store
            .list_instances()
            .await?
            .rows
            .into_iter()
            .filter(|i| i.team == team)
            .map(|i| i.name.to_string())
            .collect();
        status.rows.retain(|r| names.contains(&r.instance));
        status.releases.retain(|r| names.contains(&r.instance));
    }
    if json {
        say_json(&status)?;
    } else {
        say(render_status(&status));
    }
    Ok(EXIT_OK)
}

/// `stead instance why`: the status view, explained for one instance.
async fn instance_why(config: &DaemonConfig, name: &str, live: bool) -> Result<u8, CliError> {
    let status = if live {
        live_status(config).await?
    } else {
        local_status(config).await?
    };
    let Some(said) = stead::daemon::why::explain(&status, name) else {
        return Err(CliError {
            message: format!("no instance named {name:?} (deleted ones have nothing to wait for)"),
            code: crate::output::EXIT_NOT_FOUND,
        });
    };
    for error in &status.errors {
        complain(&format!("could not read everything: {error}"));
    }
    say(said.join("\n"));
    Ok(EXIT_OK)
}

/// What a status is read from without the daemon: the configured
/// database, the runtime, Caddy and Helm.
struct LocalSources {
    store: Arc<dyn Store>,
    docker: stead::adapters::docker::DockerRuntime,
    catalog: Catalog,
    catalog_error: Option<String>,
    helm: stead::adapters::helm::HelmProvisioner,
}

impl LocalSources {
    async fn open(config: &DaemonConfig) -> Result<Self, CliError> {
        let store = stead::daemon::open_store(config).await?;
        let docker = stead::daemon::docker_runtime(config)
            .await
            .map_err(|e| e.to_string())?;
        let (catalog, catalog_error) =
            match stead::config::load_catalog(&config.catalog, &config.grants) {
                Ok(c) => (c, None),
                Err(e) => (Catalog::default(), Some(e.to_string())),
            };
        // Only Helm types' releases are asked about, so Docker's half is not
        // needed here.
        let helm = stead::adapters::helm::HelmProvisioner::new(stead::daemon::helm_config(config))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            store,
            docker,
            catalog,
            catalog_error,
            helm,
        })
    }

    fn sources<'a>(&'a self, config: &'a DaemonConfig) -> StatusSources<'a> {
        StatusSources {
            store: self.store.as_ref(),
            runtime: &self.docker,
            catalog: &self.catalog,
            memory: None,
            caddy_admin: Some(&config.caddy.admin),
            provisioner: Some(&self.helm),
            database: redact(&config.database_url),
            now: SystemClock.now(),
        }
    }
}

/// The status as the configured database, the runtime and Caddy say.
async fn local_status(config: &DaemonConfig) -> Result<Status, CliError> {
    let local = LocalSources::open(config).await?;
    let mut status = stead::daemon::status::status(local.sources(config)).await;
    status.errors.extend(local.catalog_error);
    Ok(status)
}

/// The running daemon's status (with budgets), checked to be about the
/// configured database.
async fn live_status(config: &DaemonConfig) -> Result<Status, CliError> {
    let url = admin_url(config)?;
    let response = admin_client(config, ADMIN_TIMEOUT)?
        .get(format!("{url}/status"))
        .send()
        .await
        .map_err(|e| format!("no daemon answered on {url} ({e}); `stead status` without --live reads the database"))?;
    refuse_unauthorized(&response, &format!("{url}/status"))?;
    let status: Status = response
        .json()
        .await
        .map_err(|e| format!("{url}/status: unexpected answer: {e}"))?;
    let ours = redact(&config.database_url);
    if status.database != ours {
        return Err(format!(
            "the daemon on {url} uses database {}, not the configured {ours}; its status is not \
             this config's",
            status.database
        )
        .into());
    }
    Ok(status)
}

pub(crate) async fn store_and_catalog(
    config: &DaemonConfig,
) -> Result<(Arc<dyn Store>, Catalog), CliError> {
    let catalog =
        stead::config::load_catalog(&config.catalog, &config.grants).map_err(|e| e.to_string())?;
    let store = stead::daemon::open_store(config).await?;
    Ok((store, catalog))
}

async fn instance(config: &DaemonConfig, command: InstanceCommand) -> Result<u8, CliError> {
    match command {
        InstanceCommand::List { all, json, team } => {
            return instance_list(config, all, json, team.as_deref()).await
        }
        InstanceCommand::Show { name, json } => return instance_show(config, &name, json).await,
        InstanceCommand::Why { name, live } => return instance_why(config, &name, live).await,
        _ => {}
    }
    let (store, catalog) = store_and_catalog(config).await?;
    let ops = operator(store.as_ref(), catalog).with_quotas(
        Arc::new(config.tenancy.teams.clone()),
        config.limits.memory_bytes_default,
    );
    match command {
        InstanceCommand::Create {
            name,
            service_type,
            team,
            version,
            ttl_s,
            window,
            exists_ok,
            parameters,
            domains,
        } => {
            let request = CreateRequest {
                domains,
                parameters: parameters_once(parameters)?,
                name,
                service_type,
                team,
                version,
                ttl: ttl_s.map(Duration::from_secs),
                maintenance_window: window,
                exists_ok,
            };
            instance_create(&ops, store.as_ref(), &request).await?;
        }
        InstanceCommand::Stop { name } => {
            if ops.set_stopped(&name, true).await? {
                say(format!(
                    "{name}: stopped intent recorded; the recovery pass withdraws its traffic \
                     and stops its containers (kept, with their volumes; R4, docs/rules.md#r4)"
                ));
            } else {
                say(format!("{name} is already stopped; nothing to do"));
            }
        }
        InstanceCommand::Retry { name } => {
            instance_retry(&ops, store.as_ref(), &name).await?;
        }
        InstanceCommand::Start { name } => {
            if ops.set_stopped(&name, false).await? {
                say(format!(
                    "{name}: running intent recorded; the recovery pass starts, verifies and \
                     publishes it"
                ));
            } else {
                say(format!("{name} is already running intent; nothing to do"));
            }
        }
        InstanceCommand::Delete {
            name,
            purge_volumes,
        } => {
            instance_delete(&ops, store.as_ref(), &name, purge_volumes).await?;
        }
        InstanceCommand::Inhibit {
            name,
            service,
            reason,
        } => {
            let container = ops.inhibit(&name, &service, &reason).await?;
            say(format!(
                "held {name}/{service} at generation {} ({reason}): recovery never starts it and \
                 withdraws its traffic (R5, docs/rules.md#r5)",
                container.as_str().chars().take(12).collect::<String>()
            ));
        }
        InstanceCommand::Release { name, service } => {
            let n = ops.release(&name, &service).await?;
            say(format!("released {n} hold(s) on {name}/{service}"));
        }
        InstanceCommand::List { .. }
        | InstanceCommand::Show { .. }
        | InstanceCommand::Why { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(EXIT_OK)
}

/// The `--set` parameters of `stead instance create`, each named once.
fn parameters_once(
    parameters: Vec<(String, String)>,
) -> Result<BTreeMap<String, String>, CliError> {
    let mut given = std::collections::BTreeMap::new();
    for (name, value) in parameters {
        if given.insert(name.clone(), value).is_some() {
            return Err(stead::ops::OpsError::Invalid(format!("--set {name}: given twice")).into());
        }
    }
    Ok(given)
}

/// `stead instance create`: the instance created (or found), its
/// provision queued and recorded.
async fn instance_create(
    ops: &Ops<'_>,
    store: &dyn Store,
    request: &CreateRequest,
) -> Result<(), CliError> {
    let created = ops.create(request).await?;
    let i = &created.instance;
    match created.task {
        Some(task) => {
            say(format!(
                "created {} ({} {}, team {}); provision queued as task {task}",
                i.name, i.service_type, i.version, i.team
            ));
            record(
                store,
                [by_operator(
                    EventKind::Enqueue,
                    format!(
                        "created {} ({} {}); provision queued as task {task}",
                        i.name, i.service_type, i.version
                    ),
                )
                .instance(&i.name)],
            )
            .await;
        }
        None => say(format!(
            "{} already exists ({} {}, {}); nothing to do",
            i.name, i.service_type, i.version, i.state
        )),
    }
    Ok(())
}

/// `stead instance retry`: a failed instance provisioned again, or a
/// reprovision queued, and recorded.
async fn instance_retry(ops: &Ops<'_>, store: &dyn Store, name: &str) -> Result<(), CliError> {
    let queued = match ops.retry(name).await? {
        stead::ops::Retry::Provisioning { task } => {
            say(format!(
                "{name}: provisioning again (task {task}); `stead instance show {name}` \
                 follows it"
            ));
            Some(format!("retry: provision queued as task {task}"))
        }
        stead::ops::Retry::Reprovisioning { task } => {
            say(format!(
                "{name}: reprovisioning (task {task}): its release is installed or \
                 upgraded in place and whatever of it vanished is created again"
            ));
            Some(format!("retry: reprovision queued as task {task}"))
        }
        stead::ops::Retry::AlreadyQueued { kind } => {
            say(format!(
                "{name}: a {kind} is already queued or running; nothing to do (`stead \
                 task list`)"
            ));
            None
        }
    };
    if let Some(message) = queued {
        let event = by_operator(EventKind::Enqueue, message);
        record(store, [event.instance(&InstanceName::new(name))]).await;
    }
    Ok(())
}

/// `stead instance delete`: its deprovision queued, its queued tasks
/// cancelled, recorded, and what becomes of its named volumes said.
async fn instance_delete(
    ops: &Ops<'_>,
    store: &dyn Store,
    name: &str,
    purge_volumes: bool,
) -> Result<(), CliError> {
    let volumes = ops.declared_volumes(&ops.find(name).await?);
    let deletion = ops.delete(name, purge_volumes).await?;
    if let Deletion::Started { task, cancelled } = &deletion {
        let about = InstanceName::new(name);
        let mut events = vec![by_operator(
            EventKind::Enqueue,
            format!("delete: deprovision queued as task {task}"),
        )
        .instance(&about)];
        if !cancelled.is_empty() {
            events.push(
                by_operator(
                    EventKind::Cancel,
                    format!("delete: cancelled queued task(s) {cancelled:?} (T4)"),
                )
                .instance(&about),
            );
        }
        record(store, events).await;
    }
    match deletion {
        Deletion::Started { task, cancelled } => say(format!(
            "deleting {name}: deprovision queued as task {task}{}",
            if cancelled.is_empty() {
                String::new()
            } else {
                format!(
                    "; cancelled queued task(s) {} (T4, docs/rules.md#t4)",
                    cancelled
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )),
        Deletion::AlreadyDeleting => say(format!("{name} is already being deleted")),
        Deletion::AlreadyDeleted => say(format!("{name} is already deleted")),
    }
    if !volumes.is_empty() {
        say(if purge_volumes {
            format!(
                "its named volumes ({}) are removed with it",
                volumes.join(", ")
            )
        } else {
            format!(
                "its named volumes ({}) are kept with their data; \
                 `stead instance delete {name} --purge-volumes` removes them",
                volumes.join(", ")
            )
        });
    }
    Ok(())
}

async fn instance_list(
    config: &DaemonConfig,
    all: bool,
    json: bool,
    team: Option<&str>,
) -> Result<u8, CliError> {
    let store = stead::daemon::open_store(config).await?;
    let rows = store.list_instances().await?;
    let views: Vec<InstanceView> = rows
        .rows
        .iter()
        .filter(|i| all || i.state != stead::core::fleet::InstanceState::Deleted)
        .filter(|i| team.is_none_or(|team| i.team == team))
        .map(InstanceView::from)
        .collect();
    for bad in &rows.bad {
        complain(&format!("skipped a bad row: {bad}"));
    }
    if json {
        say_json(&views)?;
    } else {
        say(render_instances(&views, SystemClock.now()));
    }
    Ok(EXIT_OK)
}

async fn instance_show(config: &DaemonConfig, name: &str, json: bool) -> Result<u8, CliError> {
    let local = LocalSources::open(config).await?;
    let store = local.store.as_ref();
    let found = store
        .instance(&stead::core::types::InstanceName::new(name))
        .await?;
    let Some(instance) = found else {
        return Err(stead::ops::no_such_instance(name).into());
    };
    let active = store.load_active(&instance.name).await?;
    // Each service as `stead status` sees it: up or down, its last exit,
    // its budget as the event log last recorded it.
    let status = stead::daemon::status::instance_status(local.sources(config), &instance).await;
    let names = BTreeMap::from([(instance.id, instance.name.to_string())]);
    let tasks: Vec<TaskView> = store
        .tasks(true, 1000)
        .await
        .map_err(|e| e.to_string())?
        .rows
        .iter()
        .filter(|t| t.instance == instance.id)
        .map(|t| TaskView::new(t, &names))
        .collect();
    let view = InstanceView::from(&instance);
    if json {
        let services: BTreeMap<String, String> = active
            .services
            .iter()
            .map(|(s, a)| (s.to_string(), a.container.to_string()))
            .collect();
        say_json(&serde_json::json!({
            "instance": view,
            "services": services,
            "status": status.rows,
            "tasks": tasks,
        }))?;
        return Ok(EXIT_OK);
    }
    let now = SystemClock.now();
    let mut text = instance_fields(&view, &instance, now);
    for (service, record) in &active.services {
        text.push_str(&format!(
            "service {service}: generation {}\n",
            record
                .container
                .as_str()
                .chars()
                .take(12)
                .collect::<String>()
        ));
        if let Some(row) = status.rows.iter().find(|r| r.service == service.as_str()) {
            text.push_str(&stead::daemon::status::render_service(row, now));
        }
    }
    for error in &status.errors {
        complain(&format!("could not read everything: {error}"));
    }
    if !tasks.is_empty() {
        text.push('\n');
        text.push_str(&render_tasks(&tasks, now));
    }
    say(text);
    Ok(EXIT_OK)
}

/// `stead instance show`'s head: one `key: value` line per field of the
/// instance.
fn instance_fields(
    view: &InstanceView,
    instance: &stead::core::fleet::Instance,
    now: stead::core::types::Timestamp,
) -> String {
    let listed = |items: Vec<String>| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    let expires = instance
        .expires_at
        .map_or("never".into(), |t| stead::daemon::human::relative(t, now));
    let parameters = view
        .parameters
        .iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    let mut text = String::new();
    for (key, value) in [
        ("name", view.name.clone()),
        ("id", view.id.to_string()),
        ("type", view.service_type.clone()),
        ("team", view.team.clone()),
        ("version", view.version.clone()),
        ("state", view.state.clone()),
        ("intent", view.intent.clone()),
        ("expires", expires),
        (
            "window",
            view.maintenance_window
                .clone()
                .unwrap_or_else(|| "none".into()),
        ),
        ("parameters", listed(parameters)),
        ("domains", listed(view.domains.clone())),
    ] {
        text.push_str(&format!("{key}: {value}\n"));
    }
    text
}

/// The operator commands over `store` and `catalog`, at this instant,
/// their trace ids drawn from the OS.
pub(crate) fn operator(store: &dyn stead::ports::Store, catalog: Catalog) -> Ops<'_> {
    Ops::new(
        store,
        Arc::new(catalog),
        SystemClock.now(),
        stead::daemon::os_seed(),
    )
}

async fn task_cancel(config: &DaemonConfig, id: i64) -> Result<u8, CliError> {
    let (store, catalog) = store_and_catalog(config).await?;
    let ops = operator(store.as_ref(), catalog);
    match ops.cancel_task(id).await? {
        stead::ops::TaskCancel::Cancelled(task) => {
            say(format!(
                "task {id} ({} of instance {}) cancelled",
                task.kind, task.instance
            ));
            let mut event = by_operator(
                EventKind::Cancel,
                format!("cancelled queued task {id} ({})", task.kind),
            );
            if let Ok(Some(instance)) = store.instance_by_id(task.instance).await {
                event = event.instance(&instance.name);
            }
            record(store.as_ref(), [event]).await;
        }
        stead::ops::TaskCancel::AlreadyOver(task) => say(format!(
            "task {id} ({} of instance {}) was already {}{}; nothing changed",
            task.kind,
            task.instance,
            task.state,
            task.last_error
                .as_deref()
                .filter(|e| e.starts_with(stead::core::fleet::CANCELLED))
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        )),
    }
    Ok(EXIT_OK)
}

async fn task_list(
    config: &DaemonConfig,
    all: bool,
    limit: u32,
    json: bool,
) -> Result<u8, CliError> {
    let store = stead::daemon::open_store(config).await?;
    let tasks = store.tasks(all, limit).await?;
    let names: BTreeMap<i64, String> = store
        .list_instances()
        .await
        .map_err(|e| e.to_string())?
        .rows
        .into_iter()
        .map(|i| (i.id, i.name.to_string()))
        .collect();
    for bad in &tasks.bad {
        complain(&format!("skipped a bad row: {bad}"));
    }
    let views: Vec<TaskView> = tasks
        .rows
        .iter()
        .map(|t| TaskView::new(t, &names))
        .collect();
    if json {
        say_json(&views)?;
    } else if views.is_empty() {
        say(if all {
            "no tasks"
        } else {
            "no queued or running tasks (--all shows finished ones)"
        });
    } else {
        say(render_tasks(&views, SystemClock.now()));
    }
    Ok(EXIT_OK)
}

async fn rollout(config: &DaemonConfig, command: RolloutCommand) -> Result<u8, CliError> {
    let (store, catalog) = store_and_catalog(config).await?;
    let ops = operator(store.as_ref(), catalog);
    match command {
        RolloutCommand::Halt {
            service_type,
            reason,
        } => {
            rollout_halt(&ops, store.as_ref(), &service_type, &reason).await?;
        }
        RolloutCommand::Undo { service_type, to } => {
            rollout_undo(&ops, store.as_ref(), &service_type, to.as_deref()).await?;
        }
        RolloutCommand::Versions { service_type } => {
            let versions = ops.type_versions(&service_type).await?;
            if versions.is_empty() {
                say(format!(
                    "{service_type}: no version recorded yet (the leading daemon records each version \
                     it loads)"
                ));
            }
            for v in &versions {
                say(format!(
                    "{}  recorded {}  digest {}",
                    v.version,
                    v.recorded_at,
                    &v.spec_digest[..v.spec_digest.len().min(12)]
                ));
            }
        }
        RolloutCommand::Resume { service_type } => {
            let (before, _) = ops
                .set_rollout(&service_type, RolloutState::Active, "operator: resume")
                .await?;
            say(match before {
                RolloutState::Active => format!("{service_type}: rollout was already active"),
                RolloutState::Halted => {
                    format!(
                        "{service_type}: rollout resumed; upgrades are planned from the next tick"
                    )
                }
            });
        }
    }
    Ok(EXIT_OK)
}

/// `stead rollout halt`: the type's rollout halted, its queued upgrades
/// cancelled, recorded and said.
async fn rollout_halt(
    ops: &Ops<'_>,
    store: &dyn Store,
    service_type: &str,
    reason: &str,
) -> Result<(), CliError> {
    let (before, cancelled) = ops
        .set_rollout(service_type, RolloutState::Halted, reason)
        .await?;
    let mut events = Vec::new();
    if before == RolloutState::Active {
        events.push(by_operator(
            EventKind::Halt,
            format!("rollout of {service_type} halted: {reason}"),
        ));
    }
    if !cancelled.is_empty() {
        events.push(by_operator(
            EventKind::Cancel,
            format!("cancelled the queued upgrade(s) {cancelled:?} of {service_type}"),
        ));
    }
    record(store, events).await;
    say(match before {
        RolloutState::Halted => {
            format!("{service_type}: rollout was already halted; reason now {reason:?}")
        }
        RolloutState::Active => format!(
            "{service_type}: rollout halted ({reason}); no upgrade of it is planned until \
             `stead rollout resume {service_type}` (C8, docs/rules.md#c8)"
        ),
    });
    if !cancelled.is_empty() {
        let ids: Vec<String> = cancelled.iter().map(i64::to_string).collect();
        say(format!(
            "{service_type}: cancelled its queued upgrade(s): task {}",
            ids.join(", ")
        ));
    }
    Ok(())
}

/// `stead rollout undo [--to VERSION]`: the type halted (and pinned), its
/// baking instances put back, recorded; then said.
async fn rollout_undo(
    ops: &Ops<'_>,
    store: &dyn Store,
    service_type: &str,
    to: Option<&str>,
) -> Result<(), CliError> {
    let undo = match to {
        None => ops.undo_rollout(service_type).await?,
        Some(version) => ops.undo_rollout_to(service_type, version).await?,
    };
    // A Helm type's plain undo pins it to its previous version.
    let to = undo.pinned.clone();
    let halted_why = match to.as_deref() {
        None => "rollout undo".to_owned(),
        Some(version) => format!("rollout undo --to {version}"),
    };
    let mut events = vec![by_operator(
        EventKind::Halt,
        format!("rollout of {service_type} halted: {halted_why}"),
    )];
    for (instance, services) in &undo.reverted {
        let services: Vec<&str> = services.iter().map(|s| s.as_str()).collect();
        events.push(
            by_operator(
                EventKind::Revert,
                format!(
                    "rollout undo: put back on the predecessors of {}",
                    services.join(", ")
                ),
            )
            .instance(instance),
        );
    }
    record(store, events).await;
    say_undo(service_type, &undo, to.as_deref());
    Ok(())
}

/// What an undo did, as the operator reads it: the halt (and pin), the
/// instances to move, the upgrades cancelled, those going back, those
/// busy and those with nothing to undo.
fn say_undo(service_type: &str, undo: &stead::ops::Undo, to: Option<&str>) {
    say(match to {
        None => format!(
            "{service_type}: rollout halted (operator: rollout undo); \
             `stead rollout resume {service_type}` once the catalog has a fixed version"
        ),
        Some(version) => format!(
            "{service_type}: rollout halted and pinned to version {version}: its \
             instances are moved to it and new ones made at it; \
             `stead rollout resume {service_type}` lifts the pin once the catalog has a \
             fixed version"
        ),
    });
    if !undo.moving.is_empty() {
        let names: Vec<&str> = undo.moving.iter().map(|n| n.as_str()).collect();
        say(format!(
            "{service_type}: to move to version {}: {} (the reconciler queues their \
             upgrades from the next tick, within max_in_flight; `stead task list`)",
            to.unwrap_or_default(),
            names.join(", ")
        ));
    }
    if !undo.cancelled.is_empty() {
        let ids: Vec<String> = undo.cancelled.iter().map(i64::to_string).collect();
        say(format!(
            "{service_type}: cancelled its queued upgrade(s): task {}",
            ids.join(", ")
        ));
    }
    for (instance, services) in &undo.reverted {
        let services: Vec<&str> = services.iter().map(|s| s.as_str()).collect();
        say(format!(
            "{instance}: going back to its predecessors ({}): its upgrade task starts \
             and verifies them while the new version serves, then moves the route \
             (`stead task list`)",
            services.join(", ")
        ));
    }
    if !undo.busy.is_empty() {
        let names: Vec<&str> = undo.busy.iter().map(|n| n.as_str()).collect();
        say(format!(
            "{service_type}: busy, not looked at: {} (a pass or a task held the lock); \
             run the command again",
            names.join(", ")
        ));
    }
    if !undo.not_baking.is_empty() {
        let names: Vec<&str> = undo.not_baking.iter().map(|n| n.as_str()).collect();
        say(match to {
            None => format!(
                "{service_type}: nothing to undo for {} (no upgrade of it bakes: its \
                 predecessors are retired once the bake window ends; \
                 `stead rollout undo {service_type} --to VERSION` moves it back to a \
                 recorded version)",
                names.join(", ")
            ),
            Some(version) => format!(
                "{service_type}: already at version {version}: {}",
                names.join(", ")
            ),
        });
    }
}
