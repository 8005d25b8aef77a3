//! One service's recovery (R1, R4–R14, S1–S7, S11), judged from outside
//! the machine: what it was handed, each command it decided, each outcome
//! it got, and its report. The crash-loop arithmetic is the reference
//! model's ([`BudgetModel`]), never the machine's own budget.

use super::super::policy::RecoveryPolicy;
use super::super::recovery::COMMANDS_PER_RECOVERY_MAX;
use super::super::recovery::{Command, Outcome, Report, ServiceInput, Verdict};
use super::super::types::Timestamp;
use super::super::types::{Binds, ContainerStatus, Health, Intent, Observation, RuntimeError};
use super::budget_model::BudgetModel;
use super::{breach, Breach};

/// `Err` naming `rule` unless `holds`.
fn require(holds: bool, rule: &'static str, what: impl FnOnce() -> String) -> Result<(), Breach> {
    if holds {
        Ok(())
    } else {
        breach(rule, what())
    }
}

/// One recovery under judgement: hand it every command before it is
/// performed ([`decided`](Self::decided)), every outcome after
/// ([`answered`](Self::answered)), and the report at the end
/// ([`finished`](Self::finished)).
pub struct RecoveryJudge<'a> {
    policy: &'a RecoveryPolicy,
    input: ServiceInput,
    /// The budget as remembered before the run, in the reference model.
    budget_at_start: BudgetModel,
    /// The last execution known verified when the run began (R17).
    verified_at_start: Option<Timestamp>,
    commands: u32,
    intervened: bool,
    starts: u32,
    restarts: u32,
    first_inspect: Option<Result<Observation, RuntimeError>>,
    last_inspect: Option<Result<Observation, RuntimeError>>,
    last_health: Option<Result<Health, RuntimeError>>,
    last_binds: Option<Binds>,
    /// Result of the last withdrawal (`true`: succeeded).
    last_withdraw: Option<bool>,
    published_since_withdraw: bool,
    last_policy_check: Option<bool>,
    /// `now` of the last outcome: the machine decides with it.
    last_outcome_at: Timestamp,
    /// `now` the machine decided to check policy (for a start or restart).
    decided_at: Option<Timestamp>,
    /// Executions whose readiness probe passed in this run.
    ready: Vec<Option<Timestamp>>,
    /// The execution ACTIVE durably records as verified: the input's,
    /// then each record that succeeded.
    recorded: Option<Timestamp>,
    /// The execution of the record command awaiting its outcome.
    recording: Option<Timestamp>,
}

impl<'a> RecoveryJudge<'a> {
    /// A recovery of `input` under `policy`, beginning at `start`.
    pub fn new(policy: &'a RecoveryPolicy, input: ServiceInput, start: Timestamp) -> Self {
        let memory = &input.memory;
        Self {
            policy,
            budget_at_start: BudgetModel::from_entry(memory.generation.budget.as_ref()),
            verified_at_start: memory
                .generation
                .verified_started_at
                .or(input.active.verified_started_at),
            commands: 0,
            intervened: false,
            starts: 0,
            restarts: 0,
            first_inspect: None,
            last_inspect: None,
            last_health: None,
            last_binds: None,
            last_withdraw: None,
            published_since_withdraw: false,
            last_policy_check: None,
            last_outcome_at: start,
            decided_at: None,
            ready: Vec::new(),
            recorded: input.active.verified_started_at,
            recording: None,
            input,
        }
    }

    fn running(&self) -> bool {
        self.input.intent == Intent::Running
    }

    fn withdrawal_pending(&self) -> bool {
        self.last_withdraw
            .map_or(self.input.memory.withdrawal_pending, |ok| !ok)
    }

    fn current_execution(&self) -> Option<Option<Timestamp>> {
        match &self.last_inspect {
            Some(Ok(obs)) => Some(obs.started_at),
            _ => None,
        }
    }

    /// R13: a started, restarted or fresh execution must pass readiness.
    fn needs_readiness(&self, execution: Option<Timestamp>) -> bool {
        self.intervened || execution.is_none() || execution != self.verified_at_start
    }

    fn traffic_withdrawn(&self, what: &str) -> Result<(), Breach> {
        require(self.last_withdraw == Some(true), "R8/R12", || {
            format!("{what} without a successful withdrawal first")
        })?;
        require(!self.published_since_withdraw, "R8/R12", || {
            format!("{what} while a publication is routed")
        })
    }

    /// Judges `command`, which the machine decided and is about to be
    /// performed.
    pub fn decided(&mut self, command: &Command) -> Result<(), Breach> {
        self.commands += 1;
        require(self.commands <= COMMANDS_PER_RECOVERY_MAX, "bound", || {
            format!("more than {COMMANDS_PER_RECOVERY_MAX} commands")
        })?;
        require(
            !(self.running() && self.last_withdraw == Some(false)),
            "R6/R8",
            || format!("{command:?} after a failed withdrawal: nothing else may happen"),
        )?;
        let inhibited = self.input.inhibition.is_some();
        let must_withdraw_first =
            self.input.memory.withdrawal_pending || inhibited || !self.running();
        let withdraws = command == &Command::Withdraw;
        require(
            withdraws || !(self.commands == 1 && must_withdraw_first),
            "R4/R5/R6",
            || format!("withdraw first, not {command:?}"),
        )?;
        require(withdraws || !(self.running() && inhibited), "R5/S4", || {
            format!("{command:?} of an inhibited generation")
        })?;
        require(
            self.running()
                || matches!(
                    command,
                    Command::Withdraw | Command::Inspect | Command::Stop { .. }
                ),
            "R4/S3",
            || format!("stopped intent only withdraws, inspects and stops, not {command:?}"),
        )?;
        // R8: a fresh or non-running first observation is withdrawn before
        // anything else happens.
        if let Some(Ok(obs)) = &self.first_inspect {
            let fresh = obs.started_at.is_none() || obs.started_at != self.verified_at_start;
            let unverified =
                obs.status != ContainerStatus::Running && !obs.status.is_transitional();
            let closed = self.last_withdraw == Some(true);
            require(
                withdraws || closed || !(self.running() && (fresh || unverified)),
                "R8",
                || format!("{command:?} before failing closed (withdrawing) first"),
            )?;
        }
        self.command_rules(command)
    }

    fn command_rules(&mut self, command: &Command) -> Result<(), Breach> {
        match command {
            Command::CheckPolicy => self.decided_at = Some(self.last_outcome_at),
            Command::Start => self.check_start()?,
            Command::Restart { .. } => self.check_restart()?,
            Command::Stop { .. } => {
                require(!self.running(), "R4", || {
                    "Stop only for stopped intent".into()
                })?;
                require(
                    matches!(&self.last_inspect, Some(Ok(obs))
                        if obs.status == ContainerStatus::Running || obs.status.is_transitional()),
                    "R4",
                    || "only a running or transitional container is stopped".into(),
                )?;
            }
            Command::ProbeReadiness { binds, started_at } => {
                require(Some(binds) == self.last_binds.as_ref(), "R13", || {
                    format!("probed {binds:?}, not the binds read")
                })?;
                require(Some(*started_at) == self.current_execution(), "R13", || {
                    format!("probed {started_at:?}, not the execution inspected last")
                })?;
            }
            Command::PersistBinds { binds, .. } => {
                require(Some(binds) == self.last_binds.as_ref(), "R13", || {
                    format!("persisted {binds:?}, not the binds read")
                })?;
                let Some(execution) = self.current_execution() else {
                    return breach("R13", "persisted binds before inspecting".into());
                };
                require(
                    !self.needs_readiness(execution) || self.ready.contains(&execution),
                    "S7",
                    || format!("binds of {execution:?} persisted before its readiness passed"),
                )?;
            }
            Command::Publish { binds, started_at } => self.check_publish(binds, *started_at)?,
            Command::RecordExecution { started_at } => {
                require(
                    self.current_execution() == Some(Some(*started_at)),
                    "R13",
                    || format!("recorded {started_at:?}, not the execution just verified"),
                )?;
                self.recording = Some(*started_at);
            }
            _ => {}
        }
        Ok(())
    }

    /// The rules of a start and a restart alike (R11, S3, S4, R8).
    fn check_intervention(&mut self, what: &str, count: u32) -> Result<Timestamp, Breach> {
        self.intervened = true;
        require(self.running(), "S3", || {
            format!("{what} of a stopped instance")
        })?;
        require(self.input.inhibition.is_none(), "S4", || {
            format!("{what} of an inhibited generation")
        })?;
        require(count == 1, "R10", || {
            format!("more than one {what} in a recovery")
        })?;
        require(self.last_policy_check == Some(true), "R11", || {
            format!("{what} without the grants checked first")
        })?;
        self.traffic_withdrawn(what)?;
        match self.decided_at {
            Some(at) => Ok(at),
            None => Err(Breach {
                rule: "R11",
                what: format!("{what} without the grants checked first"),
            }),
        }
    }

    fn check_start(&mut self) -> Result<(), Breach> {
        self.starts += 1;
        let decided_at = self.check_intervention("start", self.starts)?;
        let first = &self.first_inspect;
        require(
            matches!(first, Some(Ok(obs)) if obs.status.is_down()),
            "R9",
            || format!("only a down container is started, saw {first:?}"),
        )?;
        let mut model = self.budget_at_start.clone();
        require(model.found_down(self.policy, decided_at), "S6", || {
            format!(
                "start at {decided_at} while the budget {:?} forbids it",
                self.input.memory.generation.budget
            )
        })
    }

    fn check_restart(&mut self) -> Result<(), Breach> {
        self.restarts += 1;
        let decided_at = self.check_intervention("restart", self.restarts)?;
        require(
            matches!(self.last_health, Some(Ok(Health::Unhealthy))),
            "R12",
            || format!("restart only for health, read {:?}", self.last_health),
        )?;
        // R12: the streak this unhealthy read makes, counted from the
        // remembered one unless the first inspection saw a new execution
        // (whose streak starts over).
        let fresh = match &self.first_inspect {
            Some(Ok(obs)) => obs.started_at.is_none() || obs.started_at != self.verified_at_start,
            _ => true,
        };
        let before = if fresh {
            0
        } else {
            self.budget_at_start.unhealthy_streak()
        };
        let threshold = self.policy.unhealthy_threshold;
        require(before + 1 >= threshold, "R12", || {
            format!(
                "restarted at an unhealthy streak of {} below the threshold {threshold}",
                before + 1
            )
        })?;
        require(self.budget_at_start.allow(decided_at), "S6", || {
            format!("restart at {decided_at} while the budget forbids it")
        })
    }

    fn check_publish(&self, binds: &Binds, started_at: Option<Timestamp>) -> Result<(), Breach> {
        require(self.running(), "S3", || {
            "a stopped instance is never published".into()
        })?;
        require(!binds.is_empty(), "R13", || {
            "a service without ports is never routed (the proxy refuses it)".into()
        })?;
        require(!self.withdrawal_pending(), "S2", || {
            "publication while a withdrawal is pending".into()
        })?;
        require(Some(binds) == self.last_binds.as_ref(), "R13", || {
            format!("published {binds:?}, not the binds read")
        })?;
        require(
            matches!(&self.last_inspect, Some(Ok(obs))
                if obs.status == ContainerStatus::Running && obs.started_at == started_at),
            "R13",
            || {
                format!(
                    "publication of {started_at:?} not confirmed by the last inspection {:?}",
                    self.last_inspect
                )
            },
        )?;
        require(
            !self.needs_readiness(started_at) || self.ready.contains(&started_at),
            "S2",
            || {
                format!(
                    "published {started_at:?} without its readiness passing (ready: {:?})",
                    self.ready
                )
            },
        )?;
        require(
            started_at.is_none() || self.recorded == started_at,
            "S11",
            || {
                format!(
                    "published {started_at:?}, an execution ACTIVE does not record as verified \
                 (a restart now would blink it)"
                )
            },
        )
    }

    /// Takes in the outcome the last command got, at `now`.
    pub fn answered(&mut self, outcome: &Outcome, now: Timestamp) {
        self.last_outcome_at = now;
        match outcome {
            Outcome::Withdrawn(result) => {
                self.last_withdraw = Some(result.is_ok());
                if result.is_ok() {
                    self.published_since_withdraw = false;
                }
            }
            Outcome::Inspected(result) => {
                if self.first_inspect.is_none() {
                    self.first_inspect = Some(result.clone());
                }
                self.last_inspect = Some(result.clone());
            }
            Outcome::PolicyChecked(result) => self.last_policy_check = Some(result.is_ok()),
            Outcome::Health(result) => self.last_health = Some(result.clone()),
            Outcome::Binds(Ok(binds)) => self.last_binds = Some(binds.clone()),
            Outcome::Readiness(Ok(())) => {
                // A probe is only decided of an inspected execution
                // (judged above); none is no readiness.
                if let Some(execution) = self.current_execution() {
                    self.ready.push(execution);
                }
            }
            Outcome::Published(Ok(())) => self.published_since_withdraw = true,
            Outcome::ExecutionRecorded(Ok(())) => self.recorded = self.recording.take(),
            _ => {}
        }
    }

    /// Judges the recovery's report.
    pub fn finished(&self, report: &Report) -> Result<(), Breach> {
        require(
            report.memory.withdrawal_pending == self.withdrawal_pending(),
            "R6",
            || "a failed withdrawal stays pending until one succeeds".into(),
        )?;
        require(!report.intervened || self.intervened, "R1", || {
            "reported an intervention it never made".into()
        })?;
        if let Some(after) = report.memory.generation.budget.as_ref() {
            // R10: only stability or forgetting resets the count.
            let before = self.budget_at_start.failures();
            require(after.failures >= before, "R10", || {
                format!(
                    "failures dropped from {before} to {} without a reset",
                    after.failures
                )
            })?;
        }
        self.judge_verdict(report)?;
        require(
            self.running() || report.memory.generation.budget.is_none(),
            "R4",
            || "a stopped instance's generation keeps its budget".into(),
        )
    }

    fn judge_verdict(&self, report: &Report) -> Result<(), Breach> {
        let inhibited = self.input.inhibition.is_some();
        match &report.verdict {
            Verdict::Verified { started_at, .. } => {
                require(self.running() && !inhibited, "S3/S4", || {
                    "verified a stopped or inhibited generation".into()
                })?;
                require(!report.memory.withdrawal_pending, "S2", || {
                    "verified while a withdrawal is pending".into()
                })?;
                require(
                    matches!(&self.last_inspect, Some(Ok(obs))
                        if obs.status == ContainerStatus::Running && obs.started_at == *started_at),
                    "R13",
                    || format!("verified {started_at:?}, not what the last inspection saw"),
                )?;
                let remembered = report.memory.generation.verified_started_at;
                require(remembered == *started_at, "R13", || {
                    format!("verified {started_at:?} but remembered {remembered:?}")
                })?;
                require(
                    !self.needs_readiness(*started_at) || self.ready.contains(started_at),
                    "R13",
                    || format!("verified {started_at:?} without its readiness passing"),
                )
            }
            Verdict::Stopped => require(!self.running(), "R4", || {
                "reported stopped with running intent".into()
            }),
            Verdict::Inhibited => require(self.running() && inhibited, "R5", || {
                "reported inhibited without an inhibition".into()
            }),
            Verdict::Gone => require(report.memory.generation.is_empty(), "R7", || {
                "a gone generation is forgotten".into()
            }),
            Verdict::Delayed { next_attempt } => {
                let decided_at = self.last_outcome_at;
                let mut model = self.budget_at_start.clone();
                require(!model.found_down(self.policy, decided_at), "R10", || {
                    "delayed although the budget allows".into()
                })?;
                let expected = model.next_attempt();
                require(*next_attempt == expected, "R10", || {
                    format!("next attempt {next_attempt:?}, the rules say {expected:?}")
                })
            }
            Verdict::Transitional | Verdict::Failed => Ok(()),
        }
    }
}
