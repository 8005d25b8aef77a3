//! One loaded instance's `InstancePass` driven through the ports, the
//! lease and lock checked before every outside effect (T2) and the
//! deadline on the monotonic clock; what its report says logged and
//! recorded.

use std::time::Duration;

use tokio::time::Instant;

use crate::core::event_log::{Event, EventKind};
use crate::core::fleet::Instance;
use crate::core::memory::InstanceMemory;
use crate::core::pass::{
    Abandon, InstanceAnswer, InstanceCommand, InstancePass, InstanceReport, PassInput,
};
use crate::core::recovery::Why;
use crate::core::traffic::HeldRoutes;
use crate::core::types::Timestamp;
use crate::engine::drive::{drive, Performer};
use crate::engine::time_until;
use crate::ports::{LeaseGrant, LoadedInstance};

use super::instance::{within, Mandate};
use super::log::{last_lines, log_budget, log_revert, StepLog};
use super::{InstanceOutcome, RecoverError, Recoverer, WatchedPass, WatchedStep};

impl Recoverer {
    /// Drives one loaded instance's pass through the ports.
    pub(super) async fn drive(
        &self,
        row: LoadedInstance,
        memory: InstanceMemory,
        mandate: &Mandate,
        held: Option<HeldRoutes>,
        deadline: Instant,
        trace: Option<&str>,
    ) -> (InstanceOutcome, InstanceMemory) {
        let LoadedInstance {
            instance,
            active,
            inhibitions,
        } = row;
        // What a watcher is told of the pass; only gathered for one.
        let watcher = self.watcher.get();
        let watched = watcher.map(|_| {
            let held = held.clone();
            (active.clone(), inhibitions.clone(), held, memory.clone())
        });
        let input = PassInput {
            instance: instance.name.clone(),
            intent: instance.intent(),
            active,
            inhibitions,
            held,
            memory,
            service_type: instance.service_type.clone(),
            now: self.ports.clock.now(),
        };
        let began_at = input.now;
        let mut pass = InstancePass::new(&self.policy, input);
        let mut steps = PassSteps {
            recoverer: self,
            instance: &instance,
            fence: &mandate.fence,
            log: StepLog::new(&self.memory, self.events(), trace, self.policy.broken),
            why: None,
            watched: watcher.map(|_| Vec::new()),
        };
        let careless = crate::broken!(self.policy.broken, ActOnExpiredLease);
        // One timer for the whole instance, not one per command: the
        // deadline is measured on the monotonic clock, and when it passes
        // the command in flight is dropped and the machine told.
        let driven = within(
            deadline,
            drive(&mut pass, &mut steps, self.ports.clock.as_ref(), || {
                careless || self.may_act(mandate)
            }),
        )
        .await;
        let abandoned = match driven {
            Ok(abandoned) => abandoned,
            Err(_) => {
                pass.abandon(Abandon::Deadline);
                Some(Abandon::Deadline)
            }
        };
        let PassSteps {
            log,
            watched: performed,
            ..
        } = steps;
        let steps = performed.unwrap_or_default();
        let report = pass.into_report();
        if let (Some(watcher), Some((active, inhibitions, held, before))) = (watcher, &watched) {
            watcher.passed(&WatchedPass {
                policy: &self.policy,
                instance: &instance.name,
                intent: instance.intent(),
                service_type: &instance.service_type,
                began: began_at,
                active,
                inhibitions,
                held: held.as_ref(),
                before,
                steps: &steps,
                abandoned,
                after: &report.memory,
            });
        }
        if let (Some(at), Some(queue)) = (report.wake_at(), self.wake.get()) {
            // The machine's instant, on the monotonic clock, a little after
            // so the budget surely allows it by then.
            let wait = time_until(at, self.ports.clock.now());
            queue.wake(&instance.name, Instant::now() + wait + WAKE_SLACK);
        }
        self.log_pass_end(&instance, &report, &log, trace).await;
        let outcome = InstanceOutcome {
            reports: report.reports,
            retired: report.retired.iter().map(ToString::to_string).collect(),
            errors: report.errors.into_iter().map(RecoverError::from).collect(),
            driven: true,
            began_at: Some(began_at),
            ..Default::default()
        };
        (outcome, report.memory)
    }

    /// What a pass's report says, logged and recorded: each budget
    /// decision, the superseded containers retired (R15), and a revert
    /// after a failed bake.
    async fn log_pass_end(
        &self,
        instance: &Instance,
        report: &InstanceReport,
        log: &StepLog<'_>,
        trace: Option<&str>,
    ) {
        let now = self.ports.clock.now();
        for service in &report.reports {
            log_budget(service, log, now);
        }
        metrics::counter!("stead_retirements_total").increment(report.retired.len() as u64);
        let events = self.events();
        for container in &report.retired {
            tracing::info!(
                instance = %instance.name,
                %container,
                "retired a superseded container: its successor serves (R15)"
            );
            events.emit(
                Event::new(
                    EventKind::Retire,
                    now,
                    "R15",
                    format!("retired superseded container {container}: its successor serves"),
                )
                .instance(&instance.name)
                .container(container)
                .traced(trace),
            );
        }
        if let Some((why, successors)) = &report.reverted {
            // Read before anything retires the failed successors (#55).
            let evidence = last_lines(self.ports.runtime.as_ref(), successors).await;
            log_revert(events, instance, why, &evidence, now, trace);
        }
    }
}

/// Performs an instance pass's commands, logging each step, and keeps them
/// for a watcher (the simulation's) when there is one.
struct PassSteps<'a> {
    recoverer: &'a Recoverer,
    instance: &'a Instance,
    fence: &'a LeaseGrant,
    log: StepLog<'a>,
    /// Why the command in flight was asked for.
    why: Option<Why>,
    watched: Option<Vec<WatchedStep>>,
}

impl Performer<InstancePass<'_>> for PassSteps<'_> {
    async fn perform(
        &mut self,
        pass: &InstancePass<'_>,
        command: &InstanceCommand,
    ) -> InstanceAnswer {
        self.why = pass.why();
        self.recoverer
            .perform(self.instance, command, self.fence)
            .await
    }

    fn performed(&mut self, command: InstanceCommand, answer: &InstanceAnswer, now: Timestamp) {
        self.log.step(&command, self.why.take(), answer, now);
        if let Some(steps) = &mut self.watched {
            steps.push(WatchedStep {
                command,
                answer: answer.clone(),
                now,
            });
        }
    }
}

/// How long after a delayed service's next attempt is allowed its wake-up
/// fires: enough that the clocks agree it is allowed by then.
const WAKE_SLACK: Duration = Duration::from_millis(10);
