//! `stead`: the daemon and its operator CLI. Everything reusable lives in
//! `stead::daemon`; this file parses arguments, sets up logging and signals,
//! and maps results onto exit codes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use stead::core::fleet::RolloutState;
use stead::daemon::ops::{self, CreateRequest, Ops};
use stead::daemon::{config, Daemon, DaemonConfig, LogFormat, Role};
use stead::engine::SystemClock;
use stead::ports::Clock;

/// stead keeps a fleet of self-hosted service instances matching what its
/// database says should exist: it recovers crashed and unhealthy containers
/// inside a crash-loop budget, publishes traffic (through Caddy) only to
/// backends it verified, and runs provisioning, upgrades and deletion as
/// durable tasks.
///
/// Configuration: one TOML file (--config, else $STEAD_CONFIG, else
/// /etc/stead/stead.toml; defaults when absent), each key overridable by
/// STEAD_<KEY> (dots become "__", e.g. STEAD_CONTROL__TICK_INTERVAL_S=5).
/// See docs/operations.md for every key.
#[derive(Parser)]
#[command(name = "stead", version, about, long_about, max_term_width = 100)]
struct Cli {
    /// The config file.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format; overrides the file's `log_format`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormatArg>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    /// The singleton reconciler: ticks, recovery, Docker events.
    Reconciler,
    /// Workers only, claiming from the shared queue.
    Worker,
    /// Both (the single-machine default).
    All,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon until SIGTERM or SIGINT.
    Run {
        #[arg(long, value_enum, default_value = "all")]
        role: RoleArg,
        /// One tick (and, with workers, the tasks then due), then exit.
        #[arg(long)]
        once: bool,
    },
    /// Run one tick and exit; non-zero when a check failed.
    Tick,
    /// Apply the embedded database migrations (idempotent).
    Migrate,
    /// Show instances, services, generations, runtime state, budgets,
    /// publication and inhibitions.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate the config and catalog files; non-zero on the first error.
    Check,
    /// Write instance intent (never touches containers directly).
    #[command(subcommand)]
    Instance(InstanceCommand),
    /// Halt or resume a service type's rollout of new versions.
    #[command(subcommand)]
    Rollout(RolloutCommand),
}

#[derive(Subcommand)]
enum InstanceCommand {
    /// Create an instance and queue its provisioning.
    Create {
        name: String,
        /// The catalog service type.
        #[arg(long = "type")]
        service_type: String,
        #[arg(long, default_value = "default")]
        team: String,
        /// Defaults to the catalog's version of the type.
        #[arg(long)]
        version: Option<String>,
        /// Time to live in seconds; the instance is deprovisioned after it.
        #[arg(long, value_name = "SECONDS")]
        ttl_s: Option<u64>,
        /// Maintenance window, e.g. "sun 03:00-05:00 Europe/Paris".
        #[arg(long)]
        window: Option<String>,
    },
    /// Set stopped intent: containers are stopped and unpublished, kept.
    Stop { name: String },
    /// Set running intent again.
    Start { name: String },
    /// Deprovision: remove containers and the release, mark deleted.
    Delete { name: String },
    /// Hold the current generation of a service: never start it.
    Inhibit {
        name: String,
        #[arg(long)]
        service: String,
        #[arg(long, default_value = ops::OPERATOR_HOLD)]
        reason: String,
    },
    /// Release the holds on a service.
    Release {
        name: String,
        #[arg(long)]
        service: String,
    },
    /// List instances.
    List,
}

#[derive(Subcommand)]
enum RolloutCommand {
    Halt {
        service_type: String,
        #[arg(long, default_value = "operator")]
        reason: String,
    },
    Resume {
        service_type: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut config = match config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stead: config: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(format) = cli.log_format {
        config.log_format = match format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        };
    }
    init_tracing(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stead: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stead: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEAD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn dispatch(command: Command, config: DaemonConfig) -> Result<ExitCode, String> {
    match command {
        Command::Run { role, once } => run(config, role, once).await,
        Command::Tick => {
            let daemon = Daemon::build(config).await.map_err(|e| e.to_string())?;
            daemon.ensure_caddy_server().await;
            let outcome = daemon.reconciler.tick().await;
            daemon.reconciler.release_lease().await;
            for (check, why) in &outcome.failed {
                eprintln!("check {} failed: {why}", check.as_str());
            }
            println!(
                "tick: leader={} tasks_enqueued={} failed_checks={}",
                outcome.leader,
                outcome.tasks_enqueued,
                outcome.failed.len()
            );
            Ok(if outcome.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Migrate => {
            stead::store::sql::migrate(&config.database_url)
                .await
                .map_err(|e| e.to_string())?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Check => check(&config),
        Command::Status { json } => status(config, json).await,
        Command::Instance(command) => instance(config, command).await,
        Command::Rollout(command) => {
            let (store, catalog) = store_and_catalog(&config).await?;
            let ops = Ops {
                store: store.as_ref(),
                catalog: &catalog,
                now: SystemClock.now(),
            };
            match command {
                RolloutCommand::Halt {
                    service_type,
                    reason,
                } => {
                    ops.set_rollout(&service_type, RolloutState::Halted, &reason)
                        .await?
                }
                RolloutCommand::Resume { service_type } => {
                    ops.set_rollout(&service_type, RolloutState::Active, "operator: resume")
                        .await?
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(config: &DaemonConfig) -> Result<ExitCode, String> {
    match &config.source {
        Some(path) => println!("config {}: ok", path.display()),
        None => println!("config: no file, defaults and environment: ok"),
    }
    if let Some(warning) = stead::adapters::caddy::host_reload_warning() {
        println!("warning: {warning}");
    }
    match stead::config::load_catalog(&config.catalog) {
        Ok(catalog) => {
            println!(
                "catalog {}: ok ({} service types)",
                config.catalog.display(),
                catalog.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn store_and_catalog(
    config: &DaemonConfig,
) -> Result<(Arc<dyn stead::ports::Store>, stead::core::catalog::Catalog), String> {
    let catalog = stead::config::load_catalog(&config.catalog).map_err(|e| e.to_string())?;
    let store = stead::daemon::open_store(config)
        .await
        .map_err(|e| e.to_string())?;
    Ok((store, catalog))
}

async fn instance(config: DaemonConfig, command: InstanceCommand) -> Result<ExitCode, String> {
    let (store, catalog) = store_and_catalog(&config).await?;
    let ops = Ops {
        store: store.as_ref(),
        catalog: &catalog,
        now: SystemClock.now(),
    };
    match command {
        InstanceCommand::Create {
            name,
            service_type,
            team,
            version,
            ttl_s,
            window,
        } => {
            let created = ops
                .create(&CreateRequest {
                    name,
                    service_type,
                    team,
                    version,
                    ttl: ttl_s.map(Duration::from_secs),
                    maintenance_window: window,
                })
                .await?;
            println!(
                "created {} ({} {}); provisioning queued",
                created.name, created.service_type, created.version
            );
        }
        InstanceCommand::Stop { name } => ops.set_stopped(&name, true).await?,
        InstanceCommand::Start { name } => ops.set_stopped(&name, false).await?,
        InstanceCommand::Delete { name } => ops.delete(&name).await?,
        InstanceCommand::Inhibit {
            name,
            service,
            reason,
        } => ops.inhibit(&name, &service, &reason).await?,
        InstanceCommand::Release { name, service } => {
            let n = ops.release(&name, &service).await?;
            println!("released {n} hold(s)");
        }
        InstanceCommand::List => {
            let rows = store.list_instances().await.map_err(|e| e.to_string())?;
            println!(
                "{:<24} {:<12} {:<12} {:<10} {:<8} {:<10}",
                "NAME", "TYPE", "TEAM", "VERSION", "INTENT", "STATE"
            );
            for i in rows.rows {
                println!(
                    "{:<24} {:<12} {:<12} {:<10} {:<8} {:<10}",
                    i.name.as_str(),
                    i.service_type,
                    i.team,
                    i.version,
                    if i.stopped { "stopped" } else { "running" },
                    i.state.as_str()
                );
            }
            for bad in rows.bad {
                eprintln!("bad row: {bad}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(config: DaemonConfig, json: bool) -> Result<ExitCode, String> {
    // A running daemon has the budgets (volatile memory); ask it first.
    let live = match config.admin_listen {
        Some(addr) => reqwest::Client::builder()
            .timeout(Duration::from_secs(3))
            .no_proxy()
            .build()
            .ok()
            .map(|c| (c, format!("http://{addr}/status"))),
        None => None,
    };
    let mut status = None;
    if let Some((client, url)) = live {
        if let Ok(resp) = client.get(&url).send().await {
            if let Ok(text) = resp.text().await {
                status = serde_json::from_str::<serde_json::Value>(&text).ok();
            }
        }
    }
    let status = match status {
        Some(value) => value,
        None => {
            let store = stead::daemon::open_store(&config)
                .await
                .map_err(|e| e.to_string())?;
            let docker = stead::daemon::docker_runtime(&config)
                .await
                .map_err(|e| e.to_string())?;
            serde_json::to_value(
                ops::status(store.as_ref(), &docker, None, Some(&config.caddy.admin)).await,
            )
            .map_err(|e| e.to_string())?
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).map_err(|e| e.to_string())?
        );
    } else {
        let parsed: ops::Status = serde_json::from_value(status).map_err(|e| e.to_string())?;
        print!("{}", ops::render_table(&parsed));
    }
    Ok(ExitCode::SUCCESS)
}

async fn run(config: DaemonConfig, role: RoleArg, once: bool) -> Result<ExitCode, String> {
    let role = match role {
        RoleArg::Reconciler => Role::Reconciler,
        RoleArg::Worker => Role::Worker,
        RoleArg::All => Role::All,
    };
    let daemon = Arc::new(Daemon::build(config).await.map_err(|e| e.to_string())?);
    tracing::info!(holder = %daemon.holder, database = %redact(&daemon.config.database_url), "stead starting");
    if once {
        let mut ok = true;
        if role.reconciles() {
            daemon.ensure_caddy_server().await;
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
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received; shutting down");
        let _ = stop_tx.send(true);
    });
    daemon.run(role, stop_rx).await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// The database URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://…@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
