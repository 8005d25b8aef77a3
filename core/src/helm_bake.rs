//! A Helm type's bake (#40) as a sans-IO machine: the way back from a
//! release that `helm upgrade --atomic --wait` installed and that goes bad
//! afterwards.
//!
//! A Docker type bakes under its predecessors' markers, judged by the
//! recovery pass (`core::bake`). A Helm type's pods are Kubernetes' to run,
//! so its bake asks Helm: for the type's bake window after the upgrade, the
//! release's status every [`HELM_BAKE_CHECK_INTERVAL`] (it must stay
//! `deployed`; anything else means another operation failed or hangs on it),
//! and at the window's end also the chart's own tests (`helm test`, which
//! passes for a chart that has none). A release found bad is rolled back to
//! what the instance records ([`HelmBakeInput::back_to`]), its recorded
//! version and spec digest restored first (so the record never names a
//! version newer than the one running: a crash between the two leaves the
//! release ahead, which the retried task upgrades and bakes again). Back to
//! the recorded version, not merely away from the bad one: an earlier
//! upgrade that never got to record its version leaves the release a
//! revision ahead of the record, and going back to that revision would
//! leave the release running a version nothing records (simulation seed
//! 40). The worker then fails the upgrade
//! task, which halts the type's rollout (C11) with the reason. A check
//! that cannot reach Helm is no verdict: it is asked again at the next
//! interval, and a window that ends with no verdict ends held, saying so.
//!
//! Every step is safe to repeat after a crash: a task retried re-runs the
//! upgrade (a new revision at the same chart) and bakes again.

use std::time::Duration;

use super::errors::{failure_of, ErrorKind, PortName, ProvisionError, StoreError, TaskError};
use super::fleet::add;
use super::machine::{Abandon, Machine, MachineAnswer, MachineCommand};
use super::release::{HelmRelease, ReleaseTarget};
use super::types::{InstanceName, Timestamp};

/// How often a baking release's status is read.
pub const HELM_BAKE_CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Most checks in a row that may fail to reach Helm at the window's end
/// before the bake ends with no verdict.
pub const HELM_BAKE_FINAL_ATTEMPTS_MAX: u32 = 3;

/// What a provisioner says of a release it was asked to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseHealth {
    Healthy,
    /// Gone bad, with the provisioner's words (a status other than
    /// `deployed`, a failed chart test).
    Bad(String),
}

/// What one bake starts from: the release the upgrade just installed, and
/// what the instance's row recorded before it.
#[derive(Clone, Debug)]
pub struct HelmBakeInput {
    pub instance: InstanceName,
    pub release: ReleaseTarget,
    /// The chart version the upgrade installed: what a revert goes back
    /// from (a retried upgrade may have installed it more than once).
    pub chart_version: String,
    /// The type's bake window; zero bakes nothing.
    pub bake: Duration,
    /// When the upgrade finished.
    pub started: Timestamp,
    /// The version and spec digest a revert puts back.
    pub previous_version: String,
    pub previous_spec_digest: Option<String>,
    /// The release of `previous_version` as the daemon recorded it: what a
    /// revert goes back to. `None` when that version was never recorded
    /// (then back to the newest revision at another chart version).
    pub back_to: Option<HelmRelease>,
    pub broken: crate::broken::Armed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelmBakeCommand {
    /// Read the release's status, and with `tests` run the chart's tests.
    Check { release: ReleaseTarget, tests: bool },
    /// Back from `bad_chart_version` to `back_to`, the release of the
    /// version the instance records (`Provisioner::roll_back_from`).
    RollBack {
        release: ReleaseTarget,
        bad_chart_version: String,
        back_to: Option<HelmRelease>,
    },
    /// Put the instance's recorded version and spec digest back.
    RestoreVersion {
        instance: InstanceName,
        version: String,
        spec_digest: Option<String>,
    },
}

impl MachineCommand for HelmBakeCommand {
    fn is_effect(&self) -> bool {
        !matches!(self, Self::Check { .. })
    }
}

#[derive(Clone, Debug)]
pub enum HelmBakeAnswer {
    Checked(Result<ReleaseHealth, ProvisionError>),
    RolledBack(Result<(), ProvisionError>),
    VersionRestored(Result<(), StoreError>),
}

impl MachineAnswer for HelmBakeAnswer {
    fn port_failure(&self) -> Option<(PortName, ErrorKind)> {
        match self {
            Self::Checked(result) => failure_of(result),
            Self::RolledBack(result) => failure_of(result),
            Self::VersionRestored(result) => failure_of(result),
        }
    }
}

/// How a bake ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BakeVerdict {
    /// The release stayed healthy through the window (or there was none).
    Held,
    /// The window ended with no check reaching Helm: held, unverified.
    Unchecked(String),
    /// The release went bad, was rolled back and the version restored.
    Reverted(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the next check, due at `due`.
    Waiting {
        due: Timestamp,
    },
    /// A check is due now (the last one when `last`).
    Checking {
        last: bool,
    },
    RollingBack {
        reason: String,
    },
    Restoring {
        reason: String,
    },
    Done,
}

/// One release's bake.
#[derive(Debug)]
pub struct HelmBake {
    input: HelmBakeInput,
    until: Timestamp,
    phase: Phase,
    /// A command was issued and its answer not yet heard.
    outstanding: bool,
    final_failures: u32,
    verdict: Option<BakeVerdict>,
    error: Option<TaskError>,
}

impl HelmBake {
    pub fn new(input: HelmBakeInput) -> Self {
        let until = add(input.started, input.bake);
        let phase = if input.bake.is_zero() {
            Phase::Done
        } else {
            Phase::Waiting {
                due: next_due(input.started, until),
            }
        };
        let verdict = input.bake.is_zero().then_some(BakeVerdict::Held);
        Self {
            input,
            until,
            phase,
            outstanding: false,
            final_failures: 0,
            verdict,
            error: None,
        }
    }

    /// When the window ends.
    pub fn until(&self) -> Timestamp {
        self.until
    }

    fn wait_from(&mut self, now: Timestamp) {
        self.phase = if now >= self.until {
            Phase::Checking { last: true }
        } else {
            Phase::Waiting {
                due: next_due(now, self.until),
            }
        };
    }

    fn fail(&mut self, step: String, error: impl Into<super::errors::Cause>) {
        self.error = Some(TaskError::new(&self.input.instance, step, error));
        self.phase = Phase::Done;
    }
}

/// The next check after `now`: an interval on, or the window's end if
/// sooner.
fn next_due(now: Timestamp, until: Timestamp) -> Timestamp {
    add(now, HELM_BAKE_CHECK_INTERVAL).min(until)
}

impl Machine for HelmBake {
    type Command = HelmBakeCommand;
    type Answer = HelmBakeAnswer;
    type Report = Result<BakeVerdict, TaskError>;

    fn poll_command(&mut self) -> Option<HelmBakeCommand> {
        assert!(!self.outstanding, "one command outstanding at a time");
        let command = match &self.phase {
            Phase::Waiting { .. } | Phase::Done => return None,
            Phase::Checking { last } => HelmBakeCommand::Check {
                release: self.input.release.clone(),
                tests: *last,
            },
            Phase::RollingBack { .. } => HelmBakeCommand::RollBack {
                release: self.input.release.clone(),
                bad_chart_version: self.input.chart_version.clone(),
                back_to: self
                    .input
                    .back_to
                    .clone()
                    .filter(|_| !crate::broken!(self.input.broken, RevertAwayFromBad)),
            },
            Phase::Restoring { .. } => HelmBakeCommand::RestoreVersion {
                instance: self.input.instance.clone(),
                version: self.input.previous_version.clone(),
                spec_digest: self.input.previous_spec_digest.clone(),
            },
        };
        self.outstanding = true;
        Some(command)
    }

    fn handle(&mut self, answer: HelmBakeAnswer, now: Timestamp) {
        assert!(self.outstanding, "an answer to a command never issued");
        self.outstanding = false;
        let release = &self.input.release.release;
        let subject = format!("release {} in {}", release.name, release.namespace);
        match (std::mem::replace(&mut self.phase, Phase::Done), answer) {
            (Phase::Checking { last }, HelmBakeAnswer::Checked(result)) => match result {
                Ok(ReleaseHealth::Healthy) if last => self.verdict = Some(BakeVerdict::Held),
                Ok(ReleaseHealth::Healthy) => self.wait_from(now),
                Ok(ReleaseHealth::Bad(reason)) => self.phase = Phase::Restoring { reason },
                Err(e) if crate::broken!(self.input.broken, UnreachableIsBad) => {
                    self.phase = Phase::Restoring {
                        reason: e.to_string(),
                    }
                }
                Err(e) if last => {
                    self.final_failures += 1;
                    if self.final_failures >= HELM_BAKE_FINAL_ATTEMPTS_MAX {
                        self.verdict = Some(BakeVerdict::Unchecked(format!(
                            "the bake of {subject} ended with no check reaching helm: {e}"
                        )));
                    } else {
                        self.phase = Phase::Waiting {
                            due: add(now, HELM_BAKE_CHECK_INTERVAL),
                        };
                    }
                }
                // No verdict: asked again at the next interval.
                Err(_) => self.wait_from(now),
            },
            (Phase::Restoring { reason }, HelmBakeAnswer::VersionRestored(result)) => {
                match result {
                    Ok(()) => self.phase = Phase::RollingBack { reason },
                    Err(e) => self.fail(
                        format!(
                            "record version {} again before rolling back {subject}, which went \
                             bad while baking ({reason})",
                            self.input.previous_version
                        ),
                        e,
                    ),
                }
            }
            (Phase::RollingBack { reason }, HelmBakeAnswer::RolledBack(result)) => match result {
                Ok(()) => self.verdict = Some(BakeVerdict::Reverted(reason)),
                Err(e) => self.fail(
                    format!("roll back {subject}, which went bad while baking ({reason})"),
                    e,
                ),
            },
            (phase, answer) => unreachable!("answer {answer:?} in phase {phase:?}"),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Waiting { due } => Some(due),
            _ => None,
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        if let Phase::Waiting { due } = self.phase {
            if now >= due {
                self.phase = Phase::Checking {
                    last: now >= self.until,
                };
            }
        }
    }

    /// Stops the bake where it is: a release found bad and not yet rolled
    /// back stays for the task's retry to find again.
    fn abandon(&mut self, why: Abandon) {
        // The command issued is dropped unanswered (the driver abandons
        // before an effect it may not make): nothing is outstanding now
        // (simulation seed 54: a rollback refused for a lost lease left
        // the machine waiting for its answer, and the next poll panicked).
        self.outstanding = false;
        if self.phase != Phase::Done {
            self.error = Some(TaskError::abandoned(&self.input.instance, why));
            self.phase = Phase::Done;
        }
    }

    fn into_report(self) -> Result<BakeVerdict, TaskError> {
        match (self.error, self.verdict) {
            (Some(error), _) => Err(error),
            (None, Some(verdict)) => Ok(verdict),
            (None, None) => Err(TaskError::abandoned(
                &self.input.instance,
                Abandon::MandateLost,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Release;
    use crate::release::ReleaseKind;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("in range")
    }

    fn bake(window_s: u64) -> HelmBake {
        HelmBake::new(HelmBakeInput {
            instance: InstanceName::new("shop"),
            release: ReleaseTarget {
                kind: ReleaseKind::Helm,
                release: Release {
                    name: "shop".into(),
                    namespace: "team-a".into(),
                },
            },
            chart_version: "2.0".into(),
            bake: Duration::from_secs(window_s),
            started: at(1000),
            previous_version: "1.0".into(),
            previous_spec_digest: Some("d1".into()),
            back_to: None,
            broken: Default::default(),
        })
    }

    /// Runs `machine` with `answers` given by kind, the clock moved to each
    /// timeout; returns the commands issued.
    fn run(
        machine: &mut HelmBake,
        mut answer: impl FnMut(&HelmBakeCommand, Timestamp) -> HelmBakeAnswer,
    ) -> Vec<(i64, HelmBakeCommand)> {
        let mut now = at(1000);
        let mut issued = Vec::new();
        for _ in 0..1000 {
            if let Some(command) = machine.poll_command() {
                issued.push((now.as_second(), command.clone()));
                let reply = answer(&command, now);
                machine.handle(reply, now);
            } else if let Some(due) = machine.poll_timeout() {
                assert!(due >= now, "a timeout in the past");
                now = due;
                machine.handle_timeout(now);
            } else {
                return issued;
            }
        }
        panic!("the bake never ended");
    }

    /// The driver abandons a machine before an effect its mandate no
    /// longer allows, with that command unanswered: the machine issues
    /// nothing more and reports the abandon (simulation seed 54 found a
    /// rollback refused so, and the next poll panicking).
    #[test]
    fn a_bake_abandoned_with_its_rollback_unanswered_issues_nothing_more() {
        let mut machine = bake(60);
        let mut now = at(1000);
        loop {
            match machine.poll_command() {
                Some(HelmBakeCommand::RollBack { .. }) => break,
                Some(HelmBakeCommand::Check { .. }) => machine.handle(
                    HelmBakeAnswer::Checked(Ok(ReleaseHealth::Bad("tests fail".into()))),
                    now,
                ),
                Some(HelmBakeCommand::RestoreVersion { .. }) => {
                    machine.handle(HelmBakeAnswer::VersionRestored(Ok(())), now)
                }
                None => {
                    now = machine.poll_timeout().expect("a check due");
                    machine.handle_timeout(now);
                }
            }
        }
        machine.abandon(Abandon::MandateLost);
        assert_eq!(machine.poll_command(), None);
        assert_eq!(machine.poll_timeout(), None);
        assert!(machine.into_report().is_err());
    }

    #[test]
    fn a_healthy_release_is_checked_every_interval_and_tested_at_the_end() {
        let mut machine = bake(100);
        let issued = run(&mut machine, |_, _| {
            HelmBakeAnswer::Checked(Ok(ReleaseHealth::Healthy))
        });
        let times: Vec<(i64, bool)> = issued
            .iter()
            .map(|(t, c)| match c {
                HelmBakeCommand::Check { tests, .. } => (*t, *tests),
                other => panic!("only checks, got {other:?}"),
            })
            .collect();
        assert_eq!(
            times,
            vec![(1030, false), (1060, false), (1090, false), (1100, true)]
        );
        assert_eq!(machine.into_report().expect("held"), BakeVerdict::Held);
    }

    #[test]
    fn a_release_gone_bad_is_rolled_back_and_its_version_restored() {
        let mut machine = bake(300);
        let issued = run(&mut machine, |command, now| match command {
            HelmBakeCommand::Check { .. } if now.as_second() < 1090 => {
                HelmBakeAnswer::Checked(Ok(ReleaseHealth::Healthy))
            }
            HelmBakeCommand::Check { .. } => {
                HelmBakeAnswer::Checked(Ok(ReleaseHealth::Bad("status failed".into())))
            }
            HelmBakeCommand::RollBack { .. } => HelmBakeAnswer::RolledBack(Ok(())),
            HelmBakeCommand::RestoreVersion { version, .. } => {
                assert_eq!(version, "1.0");
                HelmBakeAnswer::VersionRestored(Ok(()))
            }
        });
        let kinds: Vec<&str> = issued
            .iter()
            .map(|(_, c)| match c {
                HelmBakeCommand::Check { .. } => "check",
                HelmBakeCommand::RollBack { .. } => "rollback",
                HelmBakeCommand::RestoreVersion { .. } => "restore",
            })
            .collect();
        assert_eq!(kinds, ["check", "check", "check", "restore", "rollback"]);
        assert_eq!(
            machine.into_report().expect("reverted"),
            BakeVerdict::Reverted("status failed".into())
        );
    }

    /// The revert goes back to the release of the version the record
    /// names, not merely away from the bad chart (simulation seed 40).
    #[test]
    fn the_rollback_goes_back_to_the_recorded_versions_release() {
        let recorded = HelmRelease {
            name: "shop".into(),
            namespace: "team-a".into(),
            chart: "shop".into(),
            chart_version: "1.0".into(),
            values: Default::default(),
            atomic: true,
        };
        let mut machine = HelmBake::new(HelmBakeInput {
            back_to: Some(recorded.clone()),
            ..bake(30).input
        });
        let issued = run(&mut machine, |command, _| match command {
            HelmBakeCommand::Check { .. } => {
                HelmBakeAnswer::Checked(Ok(ReleaseHealth::Bad("test failed".into())))
            }
            HelmBakeCommand::RestoreVersion { .. } => HelmBakeAnswer::VersionRestored(Ok(())),
            HelmBakeCommand::RollBack { .. } => HelmBakeAnswer::RolledBack(Ok(())),
        });
        let rollback = issued
            .iter()
            .find_map(|(_, c)| match c {
                HelmBakeCommand::RollBack {
                    back_to,
                    bad_chart_version,
                    ..
                } => Some((back_to.clone(), bad_chart_version.clone())),
                _ => None,
            })
            .expect("rolled back");
        assert_eq!(rollback, (Some(recorded), "2.0".to_owned()));
    }

    #[test]
    fn a_failed_rollback_fails_the_task_after_the_version_is_restored() {
        let mut machine = bake(60);
        let issued = run(&mut machine, |command, _| match command {
            HelmBakeCommand::Check { .. } => {
                HelmBakeAnswer::Checked(Ok(ReleaseHealth::Bad("test failed".into())))
            }
            HelmBakeCommand::RestoreVersion { .. } => HelmBakeAnswer::VersionRestored(Ok(())),
            HelmBakeCommand::RollBack { .. } => HelmBakeAnswer::RolledBack(Err(
                ProvisionError::Unavailable("cluster unreachable".into()),
            )),
        });
        assert_eq!(issued.len(), 3);
        let error = machine.into_report().expect_err("the task fails");
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(error.step.contains("went bad while baking (test failed)"));
    }

    #[test]
    fn checks_that_cannot_reach_helm_are_no_verdict() {
        let mut machine = bake(60);
        let issued = run(&mut machine, |_, _| {
            HelmBakeAnswer::Checked(Err(ProvisionError::Unavailable("unreachable".into())))
        });
        // One interval check, then the last one tried three times.
        assert_eq!(issued.len(), 1 + HELM_BAKE_FINAL_ATTEMPTS_MAX as usize);
        assert!(issued
            .iter()
            .all(|(_, c)| matches!(c, HelmBakeCommand::Check { .. })));
        assert!(matches!(
            machine.into_report(),
            Ok(BakeVerdict::Unchecked(why)) if why.contains("unreachable")
        ));
    }

    #[test]
    fn no_window_bakes_nothing() {
        let mut machine = bake(0);
        assert!(run(&mut machine, |_, _| unreachable!()).is_empty());
        assert_eq!(machine.into_report().expect("held"), BakeVerdict::Held);
    }

    #[test]
    fn an_abandoned_bake_fails_its_task_fenced() {
        let mut machine = bake(60);
        machine.abandon(Abandon::MandateLost);
        assert_eq!(
            machine.into_report().expect_err("abandoned").kind(),
            ErrorKind::Fenced
        );
    }
}
