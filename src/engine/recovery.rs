//! The recovery pass (R2, R3, R15, R16): a dumb interpreter that runs the
//! core's per-service machine over the ports. Every decision is the core's;
//! this file only sequences, bounds, locks and aggregates.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::core::fleet::add;
use crate::core::fleet::{Instance, InstanceState};
use crate::core::memory::RecoveryMemory;
use crate::core::pass::{Abandon, InstanceAnswer, InstanceCommand, InstancePass, PassInput};
use crate::core::policy::{RecoveryPolicy, INSTANCE_LEASE_SLACK};
use crate::core::recovery::{Command, Outcome, Report, Verdict, Why};
use crate::core::spec::ReadinessProbe;
use crate::core::traffic::{routes_of, routes_of_gone_instances, HeldRoutes};
use crate::core::types::{
    ActiveRecord, ContainerStatus, GenerationKey, Inhibition, InstanceName, ServiceKey, ServiceName,
};
use crate::mutants::{self, Mutant};
use crate::ports::{LeaseGrant, PlaneCheck, Route, StoreError};

use super::lease::LeaseGuard;
pub use super::locks::InstanceLocks;
use super::Ports;

/// Readiness probe per (service type, service), from the catalog.
pub type ReadinessTable = BTreeMap<(String, ServiceName), ReadinessProbe>;

/// What entitles one instance's recovery to act: the reconciler lease
/// (its fence goes with every write) and the instance's lock, each trusted
/// only until it could have passed to another process.
struct Mandate {
    fence: LeaseGrant,
    lock_until: Instant,
}

/// What one instance's recovery did.
#[derive(Debug, Default)]
pub struct InstanceOutcome {
    pub reports: Vec<Report>,
    pub retired: Vec<String>,
    pub errors: Vec<String>,
    pub skipped_busy: bool,
    /// Not attempted: this process no longer holds the reconciler lease
    /// (T2), so it must not act.
    pub skipped_no_lease: bool,
}

/// What one whole pass did, aggregated (R2).
#[derive(Debug, Default)]
pub struct PassOutcome {
    pub instances: BTreeMap<InstanceName, InstanceOutcome>,
    /// Errors not tied to one instance (listing failed, bad rows).
    pub errors: Vec<String>,
}

impl InstanceOutcome {
    fn failed(error: String) -> Self {
        Self {
            errors: vec![error],
            ..Default::default()
        }
    }
}

impl PassOutcome {
    pub fn error_count(&self) -> usize {
        self.errors.len()
            + self
                .instances
                .values()
                .map(|i| i.errors.len())
                .sum::<usize>()
    }
}

/// The recovery pass and the memory it keeps between passes.
pub struct Recoverer {
    ports: Ports,
    policy: RecoveryPolicy,
    /// Replaced when the catalog is reloaded.
    readiness: Mutex<ReadinessTable>,
    memory: Mutex<RecoveryMemory>,
    locks: Arc<InstanceLocks>,
    /// This process's recovery as an instance-lock holder (T3).
    lock_holder: String,
    /// The reconciler lease every effect of recovery needs (T2).
    lease: Arc<LeaseGuard>,
}

impl Recoverer {
    pub fn new(
        ports: Ports,
        policy: RecoveryPolicy,
        readiness: ReadinessTable,
        locks: Arc<InstanceLocks>,
        lock_holder: String,
        lease: Arc<LeaseGuard>,
    ) -> Self {
        Self {
            ports,
            policy,
            readiness: Mutex::new(readiness),
            memory: Mutex::new(RecoveryMemory::default()),
            locks,
            lock_holder,
            lease,
        }
    }

    /// The lease this recovery acts under.
    pub fn lease(&self) -> &Arc<LeaseGuard> {
        &self.lease
    }

    /// Whether an outside effect may be issued now: both the lease and the
    /// instance lock are still trusted (a process paused past either must
    /// not act on resuming, T2, T3).
    fn may_act(&self, mandate: &Mandate) -> bool {
        self.lease.current().is_some() && Instant::now() < mandate.lock_until
    }

    /// The grant, if it will last one instance's recovery (renewed if
    /// needed); `None`: do not act.
    async fn fence(&self) -> Option<LeaseGrant> {
        self.lease
            .ensure(
                self.ports.store.as_ref(),
                self.policy.instance_deadline + INSTANCE_LEASE_SLACK,
            )
            .await
    }

    /// Installs the readiness probes of a reloaded catalog; the next
    /// probe uses them.
    pub fn set_readiness(&self, readiness: ReadinessTable) {
        *self.readiness.lock().expect("readiness poisoned") = readiness;
    }

    pub fn memory(&self) -> RecoveryMemory {
        self.memory.lock().expect("memory poisoned").clone()
    }

    /// One pass over every instance. Never fails as a whole: errors are
    /// aggregated per instance so one never hides another.
    pub async fn pass(&self) -> PassOutcome {
        let mut outcome = PassOutcome::default();
        let began = tokio::time::timeout(self.policy.instance_deadline, async {
            self.ports.runtime.begin_pass().await
        })
        .await;
        match began {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome.errors.push(format!("runtime list: {e}")),
            Err(_) => outcome
                .errors
                .push("runtime list: deadline exceeded".to_owned()),
        }
        // The routes are read before the instances are listed: an instance
        // created in between is listed, so its fresh route is never taken
        // for a gone instance's.
        let held = self.read_traffic_plane(&mut outcome).await;
        let rows = match self.ports.store.list_instances().await {
            Ok(rows) => rows,
            Err(e) => {
                outcome.errors.push(format!("list instances: {e}"));
                return outcome;
            }
        };
        outcome
            .errors
            .extend(rows.bad.iter().map(|e| format!("skipped row: {e}")));
        if let Some(held) = &held {
            // Bad rows may hide live instances: then nothing is taken for gone.
            if rows.bad.is_empty() {
                for gone in routes_of_gone_instances(held, &rows.rows) {
                    self.withdraw_stale(&gone, &mut outcome.errors).await;
                }
            }
        }
        for instance in rows.rows {
            if matches!(instance.state, InstanceState::Deleted) {
                self.memory
                    .lock()
                    .expect("memory poisoned")
                    .forget_instance(&instance.name);
                continue;
            }
            let result = self.recover_instance_seeing(&instance, held.as_ref()).await;
            if result.skipped_no_lease {
                // The lease is lost: nothing more may be done this pass.
                outcome
                    .errors
                    .push("reconciler lease lost; pass stopped".to_owned());
                break;
            }
            outcome.instances.insert(instance.name.clone(), result);
        }
        outcome
    }

    /// T5: makes sure of the traffic plane and reads its routes back, one
    /// call each per pass. `None` when the plane did not answer: the pass
    /// then trusts memory, as a targeted pass does.
    async fn read_traffic_plane(&self, outcome: &mut PassOutcome) -> Option<HeldRoutes> {
        let traffic = &self.ports.traffic;
        let deadline = self.policy.instance_deadline;
        match tokio::time::timeout(deadline, traffic.ensure()).await {
            Ok(Ok(PlaneCheck::Present)) => {}
            Ok(Ok(PlaneCheck::Recreated)) => tracing::warn!(
                "the traffic plane had lost stead's routes (proxy restarted without its config?); recreated, republishing verified routes"
            ),
            Ok(Ok(PlaneCheck::Corrected { was })) => tracing::warn!(
                was = %was,
                "stead's proxy server listened elsewhere than configured; corrected"
            ),
            Ok(Err(e)) => outcome.errors.push(format!("traffic plane: {e}")),
            Err(_) => outcome
                .errors
                .push("traffic plane: deadline exceeded".to_owned()),
        }
        match tokio::time::timeout(deadline, traffic.held_routes()).await {
            Ok(Ok(routes)) => Some(routes.into_iter().map(|r| (r.service, r.port)).collect()),
            Ok(Err(e)) => {
                outcome.errors.push(format!("read routes back: {e}"));
                None
            }
            Err(_) => {
                outcome
                    .errors
                    .push("read routes back: deadline exceeded".to_owned());
                None
            }
        }
    }

    /// Withdraws a route nothing may be routed by any more, under the lease.
    async fn withdraw_stale(&self, service: &ServiceKey, errors: &mut Vec<String>) {
        if self.fence().await.is_none() {
            return;
        }
        let withdrawn = tokio::time::timeout(
            self.policy.instance_deadline,
            self.ports.traffic.withdraw(service),
        )
        .await;
        match withdrawn {
            Ok(Ok(())) => {
                metrics::counter!("stead_withdrawals_total").increment(1);
                tracing::info!(
                    instance = %service.instance,
                    service = %service.service,
                    "withdrew a route nothing serves any more"
                );
            }
            Ok(Err(e)) => errors.push(format!(
                "{}/{}: withdraw stale route: {e}",
                service.instance, service.service
            )),
            Err(_) => errors.push(format!(
                "{}/{}: withdraw stale route: deadline exceeded",
                service.instance, service.service
            )),
        }
    }

    /// Recovers one instance under its lock, its deadline and the lease.
    pub async fn recover_instance(&self, instance: &Instance) -> InstanceOutcome {
        self.recover_instance_seeing(instance, None).await
    }

    /// [`Self::recover_instance`] given the routes the pass read back.
    async fn recover_instance_seeing(
        &self,
        instance: &Instance,
        held: Option<&HeldRoutes>,
    ) -> InstanceOutcome {
        let Some(fence) = self.fence().await else {
            return InstanceOutcome {
                skipped_no_lease: true,
                ..Default::default()
            };
        };
        let lock_ttl = self.policy.instance_deadline + INSTANCE_LEASE_SLACK;
        let guard = match self
            .locks
            .try_lock(instance.id, &self.lock_holder, lock_ttl)
            .await
        {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                return InstanceOutcome {
                    skipped_busy: true,
                    ..Default::default()
                }
            }
            Err(e) => {
                return InstanceOutcome {
                    errors: vec![format!("{}: lock: {e}", instance.name)],
                    ..Default::default()
                }
            }
        };
        let mandate = Mandate {
            fence,
            lock_until: guard.trusted_until(),
        };
        let out = self.recover_locked(instance, &mandate, held).await;
        guard.release().await;
        out
    }

    async fn recover_locked(
        &self,
        instance: &Instance,
        mandate: &Mandate,
        held: Option<&HeldRoutes>,
    ) -> InstanceOutcome {
        let deadline = Instant::now() + self.policy.instance_deadline;
        let loaded = within(deadline, self.load(&instance.name)).await;
        let (instance, active, inhibitions) = match loaded {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(e)) => return InstanceOutcome::failed(format!("{}: load: {e}", instance.name)),
            Err(_) => {
                return InstanceOutcome::failed(format!(
                    "{}: load: deadline exceeded",
                    instance.name
                ))
            }
        };
        let memory = self
            .memory
            .lock()
            .expect("memory poisoned")
            .of_instance(&instance.name);
        let input = PassInput {
            instance: instance.name.clone(),
            intent: instance.intent(),
            active,
            inhibitions,
            held: held.map(|held| routes_of(held, &instance.name)),
            memory: memory.clone(),
            deadline: add(self.ports.clock.now(), self.policy.instance_deadline),
        };
        let mut pass = InstancePass::new(&self.policy, input);
        let mut log = StepLog::new(memory);
        while let Some(command) = pass.poll_command() {
            // Checked with no await before the effect is issued: a process
            // paused past its lease stops here instead of acting (T2).
            let careless = mutants::active(Mutant::ActOnExpiredLease);
            if command.is_outside_effect() && !self.may_act(mandate) && !careless {
                pass.abandon(Abandon::MandateLost);
                break;
            }
            let why = pass.why();
            // The deadline is measured on the monotonic clock; the machine
            // is told when it passed.
            match within(deadline, self.perform(&instance, &command, &mandate.fence)).await {
                Ok(answer) => {
                    log.step(&command, why, &answer);
                    pass.handle(answer, self.ports.clock.now());
                }
                Err(_) => {
                    pass.abandon(Abandon::Deadline);
                    break;
                }
            }
        }
        let report = pass.into_report();
        for service in &report.reports {
            record_metrics(service);
            log_hold(service, &log.before(&service.key));
        }
        metrics::counter!("stead_retirements_total").increment(report.retired.len() as u64);
        self.memory
            .lock()
            .expect("memory poisoned")
            .replace_instance(&instance.name, report.memory);
        InstanceOutcome {
            reports: report.reports,
            retired: report.retired.iter().map(ToString::to_string).collect(),
            errors: report.errors,
            ..Default::default()
        }
    }

    /// Loads intent, ACTIVE and inhibitions under the instance lock: the
    /// listing that started the pass may be stale by now (an operator may
    /// have changed intent while earlier instances were recovered).
    async fn load(
        &self,
        name: &InstanceName,
    ) -> Result<(Instance, ActiveRecord, Vec<Inhibition>), StoreError> {
        let instance = self
            .ports
            .store
            .instance(name)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("instance {name}")))?;
        let active = self.ports.store.load_active(name).await?;
        let inhibitions = self.ports.store.load_inhibitions(name).await?;
        Ok((instance, active, inhibitions))
    }

    /// Performs one command through the ports. No decisions here.
    async fn perform(
        &self,
        instance: &Instance,
        command: &InstanceCommand,
        fence: &LeaseGrant,
    ) -> InstanceAnswer {
        let p = &self.ports;
        match command {
            InstanceCommand::Service { key, command } => {
                InstanceAnswer::Service(self.perform_service(instance, key, command, fence).await)
            }
            InstanceCommand::InspectSuccessor(id) => {
                InstanceAnswer::SuccessorInspected(p.runtime.inspect(id).await)
            }
            InstanceCommand::ReadRoutes => InstanceAnswer::RoutesRead(
                p.traffic
                    .held_routes()
                    .await
                    .map(|routes| routes.into_iter().map(|r| (r.service, r.port)).collect())
                    .map_err(|e| e.to_string()),
            ),
            InstanceCommand::StopPredecessor { generation, grace } => {
                InstanceAnswer::PredecessorStopped(p.runtime.stop(generation, *grace).await)
            }
            InstanceCommand::RemovePredecessor(generation) => {
                InstanceAnswer::PredecessorRemoved(p.runtime.remove(generation).await)
            }
            InstanceCommand::ReleaseClaims(generation) => InstanceAnswer::ClaimsReleased(
                p.store
                    .release_claims(&generation.instance, &generation.container, Some(fence))
                    .await
                    .map_err(|e| e.to_string()),
            ),
            InstanceCommand::ClearMarker(generation) => InstanceAnswer::MarkerCleared(
                p.store
                    .clear_inhibition(
                        &generation.instance,
                        &generation.service,
                        &generation.container,
                        Some(fence),
                    )
                    .await
                    .map_err(|e| e.to_string()),
            ),
            InstanceCommand::WithdrawStale(service) => {
                let result = p.traffic.withdraw(service).await;
                if result.is_ok() {
                    tracing::info!(
                        instance = %service.instance,
                        service = %service.service,
                        "withdrew a route nothing serves any more"
                    );
                }
                InstanceAnswer::StaleWithdrawn(result.map_err(|e| e.to_string()))
            }
        }
    }

    /// Performs one step of a service's recovery through the ports.
    async fn perform_service(
        &self,
        instance: &Instance,
        key: &GenerationKey,
        command: &Command,
        fence: &LeaseGrant,
    ) -> Outcome {
        let p = &self.ports;
        let fence = Some(fence);
        let service_key = ServiceKey {
            instance: key.instance.clone(),
            service: key.service.clone(),
        };
        let id = &key.container;
        match command {
            Command::Withdraw => {
                let result = p.traffic.withdraw(&service_key).await;
                if result.is_ok() {
                    metrics::counter!("stead_withdrawals_total").increment(1);
                }
                Outcome::Withdrawn(result.map_err(|e| e.to_string()))
            }
            Command::Inspect => Outcome::Inspected(p.runtime.inspect(id).await),
            Command::ReleaseClaims => Outcome::ClaimsReleased(
                p.store
                    .release_claims(&key.instance, id, fence)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            Command::CheckPolicy => {
                Outcome::PolicyChecked(p.policy.check(&key.instance, &key.service).await)
            }
            Command::Start => {
                let result = p.runtime.start(id).await;
                if result.is_ok() {
                    metrics::counter!("stead_starts_total").increment(1);
                }
                Outcome::Started(result)
            }
            Command::Restart { grace } => {
                let result = p.runtime.restart(id, *grace).await;
                if result.is_ok() {
                    metrics::counter!("stead_restarts_total").increment(1);
                }
                Outcome::Restarted(result)
            }
            Command::Stop { grace } => Outcome::Stopped(p.runtime.stop(key, *grace).await),
            Command::ReadHealth => Outcome::Health(p.runtime.health(id).await),
            Command::ReadBinds => Outcome::Binds(p.runtime.binds(id).await),
            Command::ProbeReadiness { binds } => {
                let probe = self
                    .readiness
                    .lock()
                    .expect("readiness poisoned")
                    .get(&(instance.service_type.clone(), key.service.clone()))
                    .cloned()
                    .unwrap_or(ReadinessProbe::None);
                Outcome::Readiness(p.probe.ready(&probe, binds).await)
            }
            Command::ReloadActive => Outcome::ActiveReloaded(
                p.store
                    .load_active(&key.instance)
                    .await
                    .map(|a| a.services.get(&key.service).cloned())
                    .map_err(|e| e.to_string()),
            ),
            Command::PersistBinds { binds, revision } => Outcome::BindsPersisted(
                p.store
                    .persist_binds(&key.instance, &key.service, id, revision, binds, fence)
                    .await
                    .map_err(|e| e.to_string()),
            ),
            Command::Publish { binds, started_at } => {
                let route = Route {
                    service: service_key,
                    container: id.clone(),
                    binds: binds.clone(),
                    verified_started_at: *started_at,
                };
                Outcome::Published(p.traffic.publish(&route).await.map_err(|e| e.to_string()))
            }
            Command::RecordExecution { started_at } => Outcome::ExecutionRecorded(
                p.store
                    .record_verified_execution(&key.instance, &key.service, id, *started_at, fence)
                    .await
                    .map_err(|e| e.to_string()),
            ),
        }
    }
}

/// Runs `future` until `deadline`. (madsim has no `timeout_at`, so both
/// builds use `timeout` with the remaining time.)
async fn within<F: std::future::Future>(
    deadline: Instant,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(remaining, future).await
}

fn record_metrics(report: &Report) {
    if report.intervened {
        metrics::counter!("stead_recoveries_total").increment(1);
    }
}

/// What the log of one instance's pass needs to say what each step meant.
struct StepLog {
    /// The instance's memory before the pass.
    before: RecoveryMemory,
    /// The last status inspected, per generation.
    last_status: BTreeMap<GenerationKey, ContainerStatus>,
}

impl StepLog {
    fn new(before: RecoveryMemory) -> Self {
        Self {
            before,
            last_status: BTreeMap::new(),
        }
    }

    fn before(&self, key: &GenerationKey) -> Before {
        let memory = self.before.service(key);
        Before {
            routed: memory.generation.verified_started_at.is_some(),
            next_attempt: memory
                .generation
                .budget
                .as_ref()
                .and_then(|b| b.next_attempt),
        }
    }

    fn step(&mut self, command: &InstanceCommand, why: Option<Why>, answer: &InstanceAnswer) {
        let (
            InstanceCommand::Service { key, command },
            InstanceAnswer::Service(outcome),
            Some(why),
        ) = (command, answer, why)
        else {
            return;
        };
        if let Outcome::Inspected(Ok(obs)) = outcome {
            self.last_status.insert(key.clone(), obs.status);
        }
        let last_status = self.last_status.get(key).copied();
        log_step(key, command, why, outcome, &self.before(key), last_status);
    }
}

/// What the pass knew of a service before its recovery, for the log.
struct Before {
    /// This daemon believed the service routed (it verified an execution).
    routed: bool,
    next_attempt: Option<crate::core::types::Timestamp>,
}

/// One info line per intervention (what, which service, why) and failure
/// counters by reason. A withdrawal of a route nobody was using (one that
/// only re-asserts stopped or inhibited intent, or a new container's first
/// fail-closed step) is not an intervention: it is logged at debug, so a
/// held service does not log every tick.
fn log_step(
    key: &GenerationKey,
    command: &Command,
    why: Why,
    outcome: &Outcome,
    before: &Before,
    last_status: Option<crate::core::types::ContainerStatus>,
) {
    let (instance, service) = (key.instance.as_str(), key.service.as_str());
    let container = short_id(key.container.as_str());
    match (command, outcome) {
        (Command::Withdraw, Outcome::Withdrawn(Ok(()))) => {
            // A route this daemon published, or one a failure is being
            // cleaned up after; a fresh container's first fail-closed
            // withdrawal removes nothing anyone used.
            let notable = before.routed
                || matches!(
                    why,
                    Why::Unhealthy | Why::VerificationFailed | Why::RetryWithdrawal
                );
            if notable {
                tracing::info!(
                    instance,
                    service,
                    container,
                    reason = why.label(),
                    "withdrew {instance}/{service}: {why}"
                );
            } else {
                tracing::debug!(
                    instance,
                    service,
                    reason = why.label(),
                    "withdrawal re-asserted: {why}"
                );
            }
        }
        (Command::Withdraw, Outcome::Withdrawn(Err(_))) => {
            metrics::counter!("stead_withdrawal_failures_total", "reason" => why.label())
                .increment(1);
        }
        (Command::Start, Outcome::Started(Ok(()))) => {
            let was = last_status.map_or_else(|| "down".to_owned(), |s| s.to_string());
            tracing::info!(
                instance,
                service,
                container,
                reason = why.label(),
                "started {instance}/{service}: the container was {was} (R9)"
            );
        }
        (Command::Restart { .. }, Outcome::Restarted(Ok(()))) => {
            tracing::info!(
                instance,
                service,
                container,
                reason = why.label(),
                "restarted {instance}/{service}: {why}"
            );
        }
        (Command::Stop { .. }, Outcome::Stopped(Ok(()))) => {
            tracing::info!(
                instance,
                service,
                container,
                reason = why.label(),
                "stopped {instance}/{service}: {why}"
            );
        }
        (Command::Publish { binds, .. }, Outcome::Published(Ok(()))) => {
            let binds: Vec<String> = binds
                .iter()
                .map(|(c, h)| format!("{c}->127.0.0.1:{h}"))
                .collect();
            tracing::info!(
                instance,
                service,
                container,
                reason = why.label(),
                "published {instance}/{service} ({}): {why}",
                binds.join(", ")
            );
        }
        (Command::Publish { .. }, Outcome::Published(Err(_))) => {
            metrics::counter!("stead_publication_failures_total", "reason" => why.label())
                .increment(1);
        }
        _ => {}
    }
}

/// A crash-loop hold, once per new delay rather than every pass.
fn log_hold(report: &Report, before: &Before) {
    let Verdict::Delayed {
        next_attempt: Some(next),
    } = report.verdict
    else {
        return;
    };
    if before.next_attempt == Some(next) {
        return;
    }
    let key = &report.key;
    let failures = report
        .memory
        .generation
        .budget
        .as_ref()
        .map_or(0, |b| b.failures);
    tracing::info!(
        instance = key.instance.as_str(),
        service = key.service.as_str(),
        failures,
        next_attempt = %next,
        "crash loop: {}/{} stays down until {next} after {failures} failures (budget, R10)",
        key.instance,
        key.service,
    );
}

/// The first 12 characters of a container ID, as `docker ps` shows it.
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
