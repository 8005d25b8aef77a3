//! One instance's recovery: the lease ensured, the instance lock tried
//! (R3, T3), the instance loaded under it, and `InstancePass` driven
//! through the ports with the lease and lock checked before every outside
//! effect (T2) and the deadline on the monotonic clock.

use tokio::time::Instant;

use crate::core::broken::Mutant;
use crate::core::fleet::{add, Instance};
use crate::core::pass::{Abandon, InstancePass, PassInput};
use crate::core::policy::INSTANCE_LEASE_SLACK;
use crate::core::traffic::{routes_of, HeldRoutes};
use crate::core::types::{ActiveRecord, Inhibition, InstanceName};
use crate::ports::{LeaseGrant, StoreError};

use super::log::{log_hold, record_metrics, StepLog};
use super::{InstanceOutcome, RecoverError, Recoverer};

/// What entitles one instance's recovery to act: the reconciler lease
/// (its fence goes with every write) and the instance's lock, each trusted
/// only until it could have passed to another process.
pub(super) struct Mandate {
    fence: LeaseGrant,
    lock_until: Instant,
}

impl Recoverer {
    /// Whether an outside effect may be issued now: both the lease and the
    /// instance lock are still trusted (a process paused past either must
    /// not act on resuming, T2, T3).
    pub(super) fn may_act(&self, mandate: &Mandate) -> bool {
        self.lease.current().is_some() && Instant::now() < mandate.lock_until
    }
    /// Recovers one instance under its lock, its deadline and the lease.
    pub async fn recover_instance(&self, instance: &Instance) -> InstanceOutcome {
        self.recover_instance_seeing(instance, None).await
    }

    /// [`Self::recover_instance`] given the routes the pass read back.
    pub(super) async fn recover_instance_seeing(
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
                    errors: vec![RecoverError::Lock {
                        instance: instance.name.clone(),
                        source: e,
                    }],
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
            Ok(Err(source)) => {
                return InstanceOutcome::failed(RecoverError::Load {
                    instance: instance.name.clone(),
                    source,
                })
            }
            Err(_) => {
                return InstanceOutcome::failed(RecoverError::Deadline {
                    what: format!("{}: load", instance.name),
                })
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
            let careless = self.policy.broken == Some(Mutant::ActOnExpiredLease);
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
            errors: report.errors.into_iter().map(RecoverError::from).collect(),
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
