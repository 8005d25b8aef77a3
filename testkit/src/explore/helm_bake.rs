//! A Helm type's bake (`core::helm_bake`) explored exhaustively: every
//! answer its checks, its rollback and its record's restore may give, the
//! driver's clock waking late, the lease lost before an effect, a deadline
//! and a crash of the process anywhere (its answer lost), after which the
//! task is retried as the worker retries it: the upgrade runs again (a new
//! revision at the same chart) and a fresh machine bakes again.
//!
//! The world ([`Helm`]) is the release's revision history (the version
//! each revision runs, and so its chart version; the newest runs): before
//! the upgrade, the recorded version alone or a revision ahead of it that
//! an earlier upgrade installed and never recorded (simulation seed 40: a
//! revert to the newest revision at another chart left the release there,
//! at a version nothing records), the new version at a chart of its own or
//! at the recorded version's chart with other values; when the new chart's
//! status turns bad and when its chart tests start failing, and the
//! instance's record (its version and spec digest). A fault either fails
//! the port call (a check that cannot reach Helm, a rollback or a restore
//! that fails) or changes the world (the release goes bad at this very
//! check, its tests start failing, a rollback that took place but timed
//! out, a restore that wrote the version and not the digest).
//!
//! Safety, after every step of every run (see [`Judge`]): H4 (a record's
//! restore and a rollback only after a check of this run said the release
//! was bad, never off one that could not reach Helm), the record restored
//! before the rollback and to what it said before the upgrade, the
//! rollback off the chart version the upgrade installed, no check once the
//! release was found bad, the chart's tests run exactly from the window's
//! end, every wait at most one interval, the number of commands bounded by
//! the window, nothing issued once the machine is done or abandoned, a zero
//! window baking nothing, and each verdict and error saying what happened
//! (a window with no verdict ends held and says so; an abandon fails the
//! task fenced or transient). Across runs the record never names a
//! version newer than the one the release runs.
//!
//! Liveness, at the end of a path (its last attempt runs once the faults
//! are spent, or after [`ATTEMPTS`] attempts, hushed): a release found bad
//! ends rolled back to exactly the version its record names, or its failure
//! reported (a permanent error), never held; a run without faults ends
//! with the verdict the truth calls for (rolled back if the chart was bad
//! when checked, held otherwise).

use std::time::Duration;

use stead::core::broken::Mutant;
use stead::core::errors::{ErrorKind, ProvisionError, StoreError, TaskError};
use stead::core::fleet::Release;
use stead::core::helm_bake::{
    BakeVerdict, HelmBake, HelmBakeAnswer, HelmBakeCommand, HelmBakeInput, ReleaseHealth,
    HELM_BAKE_CHECK_INTERVAL, HELM_BAKE_FINAL_ATTEMPTS_MAX,
};
use stead::core::machine::{Abandon, Machine, MachineCommand};
use stead::core::release::{HelmRelease, ReleaseKind, ReleaseTarget};
use stead::core::types::{InstanceName, Timestamp};

use super::Chooser;
use crate::machine::base;
use crate::model::later;

/// Attempts of the task on which faults are on offer; any after them
/// run hushed.
pub const ATTEMPTS: usize = 3;
/// The bake windows explored: none, exactly one interval (the first
/// check is the last), and a window of three checks whose last comes
/// before a full interval.
pub const WINDOWS: [u64; 3] = [0, 30, 75];
/// What the release ran before the upgrade and the new version's chart,
/// as set up.
pub const HISTORIES: [&str; 3] = [
    "the recorded version; the new version at a chart of its own",
    "a version an earlier upgrade installed and never recorded; the new version at a chart \
     of its own",
    "the recorded version; the new version at its chart, with other values",
];
/// How the new chart behaves, as set up (faults may make it go bad
/// sooner).
pub const RELEASES: [&str; 3] = [
    "healthy",
    "its status goes bad by the second check",
    "its chart tests fail",
];
/// How long each command takes, the upgrade before the bake, and the
/// time before a failed task is retried.
const STEP: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// How late the driver's clock may wake (a fault): past the next
/// interval.
const LATE: Duration = Duration::from_secs(45);

/// The versions: the one the instance records, the one an earlier
/// upgrade may have left unrecorded, the one this upgrade installs.
const OLD: &str = "1";
const AHEAD: &str = "1.5";
const NEW: &str = "2";
const OLD_DIGEST: &str = "d1";
const NEW_DIGEST: &str = "d2";

/// The release and the instance's record. Every field is ordered.
#[derive(Clone, Debug)]
struct Helm {
    /// The version each revision runs, oldest first: the last runs.
    revisions: Vec<&'static str>,
    /// The new version keeps the recorded version's chart.
    same_chart: bool,
    /// From when the new chart's status is other than `deployed`.
    bad_from: Option<Timestamp>,
    /// From when the new chart's tests fail.
    tests_fail_from: Option<Timestamp>,
    /// The instance's recorded version and spec digest.
    version: String,
    digest: Option<String>,
}

impl Helm {
    fn running(&self) -> &'static str {
        self.revisions.last().expect("a revision")
    }

    /// The chart version `version` runs.
    fn chart(&self, version: &str) -> String {
        match version {
            NEW if !self.same_chart => "2.0".to_owned(),
            NEW | OLD => "1.0".to_owned(),
            other => format!("{other}.0"),
        }
    }

    /// The release of the recorded version, which a revert goes back to.
    fn recorded_release(&self) -> HelmRelease {
        HelmRelease {
            name: "shop".into(),
            namespace: "team-a".into(),
            chart: "shop".into(),
            chart_version: self.chart(OLD),
            values: Default::default(),
            atomic: true,
        }
    }

    /// `helm upgrade`: a new revision at the new version.
    fn upgrade(&mut self) {
        self.revisions.push(NEW);
    }

    /// `Provisioner::roll_back_from` as the Helm adapter does it: to
    /// `back_to`'s chart (`helm rollback` to its newest revision, nothing
    /// when the newest already runs it), an upgrade to it when only the
    /// values differ; without it, the newest revision at another chart.
    fn roll_back_from(&mut self, bad: &str, back_to: Option<&HelmRelease>) {
        let back = match back_to {
            Some(back_to) if back_to.chart_version == bad => OLD,
            Some(back_to) => {
                let at = |version: &&'static str| self.chart(version) == back_to.chart_version;
                if at(&self.running()) {
                    return;
                }
                self.revisions.iter().rev().copied().find(at).unwrap_or(OLD)
            }
            None => self
                .revisions
                .iter()
                .rev()
                .copied()
                .find(|version| self.chart(version) != bad)
                .expect("a revision before the upgrade"),
        };
        self.revisions.push(back);
    }

    /// What a check at `now` truly finds.
    fn health(&self, tests: bool, now: Timestamp) -> ReleaseHealth {
        let new = self.running() == NEW;
        let since = |from: Option<Timestamp>| new && from.is_some_and(|t| t <= now);
        if since(self.bad_from) {
            ReleaseHealth::Bad("release shop in team-a is failed at its newest revision".into())
        } else if tests && since(self.tests_fail_from) {
            ReleaseHealth::Bad("helm test of release shop in team-a: 1 test failed".into())
        } else {
            ReleaseHealth::Healthy
        }
    }

    /// The record never names a version newer than the one running.
    fn check(&self) {
        assert!(
            self.version != NEW || self.running() == NEW,
            "the record names version {} while the release runs version {}",
            self.version,
            self.running()
        );
    }
}

fn target() -> ReleaseTarget {
    ReleaseTarget {
        kind: ReleaseKind::Helm,
        release: Release {
            name: "shop".into(),
            namespace: "team-a".into(),
        },
    }
}

/// What one run of the machine did, judged as it goes.
#[derive(Debug)]
struct Judge {
    input: HelmBakeInput,
    until: Timestamp,
    /// Most commands a run may issue: the window's checks, the last one
    /// tried again, a restore and a rollback.
    bound: usize,
    commands: usize,
    /// The reason a check of this run gave for the release being bad.
    bad: Option<String>,
    restored: bool,
    restore_failed: bool,
    rolled_back: Option<Result<(), ()>>,
    /// The last check's `tests` and whether it answered healthy.
    last_check: Option<(bool, bool)>,
    /// Checks with tests that could not reach Helm, and the last error.
    final_errors: u32,
    last_error: Option<String>,
    abandoned: Option<Abandon>,
}

impl Judge {
    fn new(input: &HelmBakeInput, until: Timestamp) -> Self {
        let interval = HELM_BAKE_CHECK_INTERVAL.as_secs();
        let checks = input.bake.as_secs().div_ceil(interval) as usize;
        Self {
            input: input.clone(),
            until,
            bound: checks + HELM_BAKE_FINAL_ATTEMPTS_MAX as usize - 1 + 2,
            commands: 0,
            bad: None,
            restored: false,
            restore_failed: false,
            rolled_back: None,
            last_check: None,
            final_errors: 0,
            last_error: None,
            abandoned: None,
        }
    }

    /// Before `command` is performed, at `now`.
    fn issued(&mut self, command: &HelmBakeCommand, now: Timestamp) {
        assert!(self.abandoned.is_none(), "a command after the abandon");
        self.commands += 1;
        assert!(
            self.commands <= self.bound,
            "{} commands in a window of {:?}: more than its {} checks and a revert",
            self.commands,
            self.input.bake,
            self.bound
        );
        match command {
            HelmBakeCommand::Check { release, tests } => {
                assert!(
                    self.bad.is_none(),
                    "a check after the release was found bad"
                );
                assert_eq!(release, &self.input.release, "a check of another release");
                assert_eq!(
                    *tests,
                    now >= self.until,
                    "the chart's tests run exactly from the window's end ({}), checked at {now}",
                    self.until
                );
            }
            HelmBakeCommand::RestoreVersion {
                instance,
                version,
                spec_digest,
            } => {
                assert!(
                    self.bad.is_some(),
                    "H4: the record restored though no check said the release was bad"
                );
                assert!(!self.restored, "the record restored twice");
                assert_eq!(instance, &self.input.instance);
                assert_eq!(
                    version, &self.input.previous_version,
                    "restored to another version"
                );
                assert_eq!(spec_digest, &self.input.previous_spec_digest);
            }
            HelmBakeCommand::RollBack {
                release,
                bad_chart_version,
                ..
            } => {
                assert!(
                    self.bad.is_some(),
                    "H4: rolled back though no check said the release was bad"
                );
                assert!(
                    self.restored,
                    "rolled back before the record was restored: a crash between the two \
                     would leave the record newer than the release"
                );
                assert!(self.rolled_back.is_none(), "rolled back twice");
                assert_eq!(
                    release, &self.input.release,
                    "a rollback of another release"
                );
                assert_eq!(
                    bad_chart_version, &self.input.chart_version,
                    "rolled back off another chart version than the upgrade installed"
                );
            }
        }
    }

    /// `answer` to `command` is handed to the machine at `now`.
    fn answered(&mut self, command: &HelmBakeCommand, answer: &HelmBakeAnswer) {
        match (command, answer) {
            (HelmBakeCommand::Check { tests, .. }, HelmBakeAnswer::Checked(result)) => {
                let healthy = matches!(result, Ok(ReleaseHealth::Healthy));
                self.last_check = Some((*tests, healthy));
                match result {
                    Ok(ReleaseHealth::Bad(reason)) => self.bad = Some(reason.clone()),
                    Err(e) if *tests => {
                        self.final_errors += 1;
                        self.last_error = Some(e.to_string());
                    }
                    _ => {}
                }
            }
            (_, HelmBakeAnswer::VersionRestored(result)) => {
                self.restored = result.is_ok();
                self.restore_failed = result.is_err();
            }
            (_, HelmBakeAnswer::RolledBack(result)) => {
                self.rolled_back = Some(result.clone().map_err(|_| ()));
            }
            (command, answer) => panic!("{answer:?} is no answer to {command:?}"),
        }
    }

    /// Once the machine handled an answer at `now` and goes on waiting:
    /// at most an interval, never in the past.
    fn waits(&self, due: Timestamp, now: Timestamp) {
        assert!(due > now, "a check due at {due}, not after {now}");
        assert!(
            due <= later(now, HELM_BAKE_CHECK_INTERVAL),
            "a check due at {due}, more than an interval after {now}"
        );
        assert!(
            self.bad.is_none(),
            "waiting after the release was found bad"
        );
    }

    /// The machine is done and reports `report`.
    fn reported(&self, report: &Result<BakeVerdict, TaskError>) {
        if self.input.bake.is_zero() {
            assert_eq!(self.commands, 0, "a zero window baked");
            assert_eq!(report, &Ok(BakeVerdict::Held), "a zero window not held");
        }
        if let Some(why) = self.abandoned {
            let kind = report.as_ref().err().map(TaskError::kind);
            let expected = match why {
                Abandon::MandateLost => ErrorKind::Fenced,
                Abandon::Deadline => ErrorKind::Transient,
            };
            assert_eq!(
                kind,
                Some(expected),
                "abandoned ({why:?}), reported {report:?}"
            );
            return;
        }
        match report {
            Ok(BakeVerdict::Held) => self.held(),
            Ok(BakeVerdict::Unchecked(why)) => self.unchecked(why),
            Ok(BakeVerdict::Reverted(reason)) => {
                assert_eq!(
                    self.bad.as_ref(),
                    Some(reason),
                    "reverted for another reason"
                );
                assert_eq!(self.rolled_back, Some(Ok(())), "reverted, not rolled back");
            }
            Err(e) => self.failed(e),
        }
    }

    fn crashed(&self) -> Ended {
        Ended {
            report: None,
            found_bad: self.bad.is_some(),
        }
    }

    fn held(&self) {
        assert!(self.bad.is_none(), "held though a check found it bad");
        if !self.input.bake.is_zero() {
            assert_eq!(
                self.last_check,
                Some((true, true)),
                "held without a last check (with the chart's tests) that found it healthy"
            );
        }
    }

    fn unchecked(&self, why: &str) {
        assert!(self.bad.is_none(), "unchecked though a check found it bad");
        assert_eq!(
            self.final_errors, HELM_BAKE_FINAL_ATTEMPTS_MAX,
            "unchecked after {} failed last checks",
            self.final_errors
        );
        let error = self.last_error.as_deref().expect("an error");
        assert!(
            why.contains("no check reaching helm") && why.contains("shop") && why.contains(error),
            "an unchecked window that does not say so: {why:?}"
        );
    }

    /// The run failed with `e`: its rollback or its restore did.
    fn failed(&self, e: &TaskError) {
        let reason = self
            .bad
            .as_deref()
            .expect("a failure only after a bad check");
        assert!(
            e.step
                .contains(&format!("went bad while baking ({reason})")),
            "a failure that does not say why it rolled back: {e}"
        );
        if self.restore_failed {
            assert!(
                self.rolled_back.is_none(),
                "rolled back after a failed restore"
            );
        } else {
            assert_eq!(
                self.rolled_back,
                Some(Err(())),
                "failed, yet rolled back: {e}"
            );
        }
    }
}

/// How a run of the machine ended, and whether a check of it found the
/// release bad.
struct Ended {
    /// `None`: the process died, nothing reported.
    report: Option<Result<BakeVerdict, TaskError>>,
    found_bad: bool,
}

/// The input of one attempt's bake, started at `now`.
fn input(world: &Helm, bake: Duration, now: Timestamp, broken: Option<Mutant>) -> HelmBakeInput {
    HelmBakeInput {
        instance: InstanceName::new("shop"),
        release: target(),
        chart_version: world.chart(NEW),
        bake,
        started: now,
        previous_version: world.version.clone(),
        previous_spec_digest: world.digest.clone(),
        back_to: Some(world.recorded_release()),
        broken,
    }
}

/// The answer to a check: the truth, a check that cannot reach Helm,
/// the release going bad (or its tests failing) at this very check, or
/// the process gone (`None`, with `Some(why)` when the machine is
/// abandoned for a deadline).
fn check(
    ch: &mut Chooser,
    world: &mut Helm,
    tests: bool,
    now: Timestamp,
) -> Result<HelmBakeAnswer, Option<Abandon>> {
    let error = |e: ProvisionError| Ok(HelmBakeAnswer::Checked(Err(e)));
    match ch.choose(if tests { 8 } else { 7 }) {
        1 => {
            return error(ProvisionError::Unavailable(
                "Kubernetes cluster unreachable".into(),
            ))
        }
        2 => {
            return error(ProvisionError::Unavailable(
                "helm status timed out after 30s".into(),
            ))
        }
        3 => return error(ProvisionError::Failed("helm status: exit status 1".into())),
        4 => world.bad_from = Some(world.bad_from.map_or(now, |t| t.min(now))),
        5 => return Err(None),
        6 => return Err(Some(Abandon::Deadline)),
        7 => world.tests_fail_from = Some(world.tests_fail_from.map_or(now, |t| t.min(now))),
        _ => {}
    }
    Ok(HelmBakeAnswer::Checked(Ok(world.health(tests, now))))
}

/// What the driver does with an effect: performs it (and its answer, the
/// truth or a port's failure), or the lease is lost right before it
/// (`Err(Some(MandateLost))`), or the process dies once it took place
/// (`Err(None)`).
fn effect(
    ch: &mut Chooser,
    world: &mut Helm,
    command: &HelmBakeCommand,
) -> Result<HelmBakeAnswer, Option<Abandon>> {
    let pick = ch.choose(6);
    if pick == 1 {
        return Err(Some(Abandon::MandateLost));
    }
    let store = || StoreError::Unavailable("store down".into());
    let provision = |e: &str| ProvisionError::Unavailable(e.into());
    let answer = match command {
        HelmBakeCommand::RestoreVersion {
            version,
            spec_digest,
            ..
        } => match pick {
            3 => HelmBakeAnswer::VersionRestored(Err(store())),
            4 => HelmBakeAnswer::VersionRestored(Err(StoreError::Conflict("row moved".into()))),
            _ => {
                world.version = version.clone();
                if pick == 5 {
                    // The version written, the digest not.
                    HelmBakeAnswer::VersionRestored(Err(store()))
                } else {
                    if let Some(digest) = spec_digest {
                        world.digest = Some(digest.clone());
                    }
                    HelmBakeAnswer::VersionRestored(Ok(()))
                }
            }
        },
        HelmBakeCommand::RollBack {
            bad_chart_version,
            back_to,
            ..
        } => match pick {
            3 => HelmBakeAnswer::RolledBack(Err(provision("Kubernetes cluster unreachable"))),
            4 => HelmBakeAnswer::RolledBack(Err(ProvisionError::Failed(
                "helm rollback: exit status 1".into(),
            ))),
            _ => {
                world.roll_back_from(bad_chart_version, back_to.as_ref());
                if pick == 5 {
                    // It took place; the wait for it timed out.
                    HelmBakeAnswer::RolledBack(Err(provision("helm rollback timed out")))
                } else {
                    HelmBakeAnswer::RolledBack(Ok(()))
                }
            }
        },
        HelmBakeCommand::Check { .. } => unreachable!("a check is no effect"),
    };
    if pick == 2 {
        return Err(None);
    }
    Ok(answer)
}

/// `command`, short, for a trace line.
fn show(command: &HelmBakeCommand) -> String {
    match command {
        HelmBakeCommand::Check { tests: false, .. } => "check the status".to_owned(),
        HelmBakeCommand::Check { tests: true, .. } => "check the status and test".to_owned(),
        HelmBakeCommand::RestoreVersion {
            version,
            spec_digest,
            ..
        } => format!("restore the record to {version} ({spec_digest:?})"),
        HelmBakeCommand::RollBack {
            bad_chart_version, ..
        } => format!("roll back off chart {bad_chart_version}"),
    }
}

/// Seconds since the path began, for a trace line.
fn t(now: Timestamp) -> i64 {
    now.as_second() - base().as_second()
}

/// What the driver does after a step.
enum Next {
    Go,
    /// The machine is done, or abandoned for a deadline (the caller
    /// dropped the driver).
    Stop,
    /// The process died.
    Crash,
}

/// One run of the machine and its judge.
struct Run {
    machine: HelmBake,
    judge: Judge,
    attempt: usize,
}

impl Run {
    fn abandon(&mut self, why: Abandon) {
        self.machine.abandon(why);
        self.judge.abandoned = Some(why);
    }

    /// Performs `command` as the driver does: the mandate checked right
    /// before an effect, the answer handed with the clock read after it.
    fn command(
        &mut self,
        ch: &mut Chooser,
        world: &mut Helm,
        command: HelmBakeCommand,
        now: &mut Timestamp,
    ) -> Next {
        let (attempt, at) = (self.attempt, t(*now));
        ch.step(|| format!("attempt {attempt}, t+{at}s: {}", show(&command)));
        self.judge.issued(&command, *now);
        let answer = match &command {
            HelmBakeCommand::Check { tests, .. } => check(ch, world, *tests, *now),
            effect_command => {
                assert!(
                    effect_command.is_effect(),
                    "{effect_command:?} is no effect"
                );
                effect(ch, world, effect_command)
            }
        };
        world.check();
        let answer = match answer {
            Ok(answer) => answer,
            Err(None) => {
                ch.step(|| "   -> the process dies, the answer lost".to_owned());
                return Next::Crash;
            }
            Err(Some(why)) => {
                ch.step(|| format!("   -> abandoned: {}", why.describe()));
                self.abandon(why);
                // Lease lost, the driver goes on (with nothing to issue);
                // a deadline drops it.
                return match why {
                    Abandon::MandateLost => Next::Go,
                    Abandon::Deadline => Next::Stop,
                };
            }
        };
        *now = later(*now, STEP);
        ch.step(|| format!("   -> {answer:?}"));
        self.judge.answered(&command, &answer);
        self.machine.handle(answer, *now);
        if let Some(due) = self.machine.poll_timeout() {
            self.judge.waits(due, *now);
        }
        Next::Go
    }

    /// The machine waits until `due`: the driver's clock wakes on time or
    /// late, or the deadline passes, or the process dies.
    fn timeout(&mut self, ch: &mut Chooser, due: Timestamp, now: &mut Timestamp) -> Next {
        let attempt = self.attempt;
        match ch.choose(4) {
            1 => *now = later(due, LATE),
            2 => {
                ch.step(|| format!("attempt {attempt}: waiting, the deadline passes"));
                self.abandon(Abandon::Deadline);
                return Next::Stop;
            }
            3 => {
                ch.step(|| format!("attempt {attempt}: the process dies while waiting"));
                return Next::Crash;
            }
            _ => *now = due,
        }
        let (at, due) = (t(*now), t(due));
        ch.step(|| format!("attempt {attempt}: wakes at t+{at}s for t+{due}s"));
        self.machine.handle_timeout(*now);
        Next::Go
    }

    /// Done or abandoned: nothing more, even woken again; the report
    /// judged.
    fn end(mut self, ch: &mut Chooser, now: Timestamp) -> Ended {
        assert_eq!(self.machine.poll_command(), None, "a command once done");
        assert_eq!(self.machine.poll_timeout(), None, "a wait once done");
        self.machine
            .handle_timeout(later(now, Duration::from_secs(3600)));
        assert_eq!(
            self.machine.poll_command(),
            None,
            "a command once done and woken"
        );
        let report = self.machine.into_report();
        let attempt = self.attempt;
        ch.step(|| format!("attempt {attempt} reports {report:?}"));
        self.judge.reported(&report);
        Ended {
            found_bad: self.judge.bad.is_some(),
            report: Some(report),
        }
    }
}

/// One run of the machine, driven as `engine::drive` drives it.
fn bake(
    ch: &mut Chooser,
    world: &mut Helm,
    input: HelmBakeInput,
    attempt: usize,
    now: &mut Timestamp,
) -> Ended {
    let machine = HelmBake::new(input.clone());
    let mut run = Run {
        judge: Judge::new(&input, machine.until()),
        machine,
        attempt,
    };
    loop {
        ch.state(&(&run.machine, &*world));
        let next = if let Some(command) = run.machine.poll_command() {
            run.command(ch, world, command, now)
        } else if let Some(due) = run.machine.poll_timeout() {
            run.timeout(ch, due, now)
        } else {
            Next::Stop
        };
        match next {
            Next::Go => {}
            Next::Stop => return run.end(ch, *now),
            Next::Crash => return run.judge.crashed(),
        }
    }
}

/// The window and the release's behaviour, each explored in full.
fn setup(ch: &mut Chooser, started: Timestamp) -> (Duration, Helm) {
    let window = WINDOWS[ch.setup(WINDOWS.len())];
    let which = ch.setup(RELEASES.len());
    let history = ch.setup(HISTORIES.len());
    ch.step(|| {
        format!(
            "setup: a window of {window} s, a release {}, running {}",
            RELEASES[which], HISTORIES[history]
        )
    });
    let second_check = later(started, HELM_BAKE_CHECK_INTERVAL + STEP * 2);
    let world = Helm {
        revisions: if history == 1 {
            vec![OLD, AHEAD]
        } else {
            vec![OLD]
        },
        same_chart: history == 2,
        bad_from: (which == 1).then_some(second_check),
        tests_fail_from: (which == 2).then_some(started),
        version: OLD.to_owned(),
        digest: Some(OLD_DIGEST.to_owned()),
    };
    (Duration::from_secs(window), world)
}

/// How the task ended, for the liveness properties.
#[derive(Debug)]
struct Outcome {
    report: Result<BakeVerdict, TaskError>,
    /// The last attempt took no fault.
    clean: bool,
    /// When the last attempt's bake started.
    started: Timestamp,
    /// Some check of some attempt found the release bad.
    found_bad: bool,
}

/// One path: the task's attempts (each an upgrade, then a bake), the
/// faults its choices make, the checks.
pub fn run(ch: &mut Chooser, broken: Option<Mutant>) {
    let mut now = base();
    let (window, mut world) = setup(ch, later(now, STEP));
    let mut found_bad = false;
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        if attempt > ATTEMPTS {
            ch.hush();
        }
        world.upgrade();
        now = later(now, STEP);
        let faults = ch.faults();
        let started = now;
        let input = input(&world, window, now, broken);
        let ended = bake(ch, &mut world, input, attempt, &mut now);
        found_bad |= ended.found_bad;
        // A transient failure (a crash, an abandon, a port down) is retried.
        let report = ended
            .report
            .filter(|r| r.as_ref().map_or_else(|e| e.is_permanent(), |_| true));
        match report {
            Some(report) => {
                let clean = ch.faults() == faults;
                break Outcome {
                    report,
                    clean,
                    started,
                    found_bad,
                };
            }
            None => {
                now = later(now, RETRY_AFTER);
                ch.step(|| "the task is retried: upgraded again, baked again".to_owned());
            }
        }
    };
    liveness(&mut world, window, &outcome);
}

/// At the end of the path: the task's last word and what the world holds.
fn liveness(world: &mut Helm, window: Duration, outcome: &Outcome) {
    match &outcome.report {
        Ok(BakeVerdict::Held | BakeVerdict::Unchecked(_)) => {
            // The worker records the version the bake held.
            world.version = NEW.to_owned();
            world.digest = Some(NEW_DIGEST.to_owned());
            world.check();
        }
        Ok(BakeVerdict::Reverted(_)) => {
            assert_eq!(
                world.running(),
                OLD,
                "reverted, yet the release runs another version than the record names"
            );
            assert_eq!(
                (world.version.as_str(), world.digest.as_deref()),
                (OLD, Some(OLD_DIGEST)),
                "reverted, yet the record is not what it was"
            );
        }
        Err(e) => assert!(e.is_permanent(), "a transient failure is retried: {e}"),
    }
    let held = matches!(outcome.report, Ok(BakeVerdict::Held));
    assert!(
        !(outcome.found_bad && held),
        "a release found bad ended held: {:?}",
        outcome.report
    );
    if outcome.clean {
        let until = later(outcome.started, window);
        let truly_bad = !window.is_zero()
            && (world.bad_from.is_some_and(|t| t <= until)
                || world.tests_fail_from.is_some_and(|t| t <= until));
        if truly_bad {
            assert!(
                matches!(outcome.report, Ok(BakeVerdict::Reverted(_))),
                "a release bad within its window, baked without a fault, not rolled back: {:?}",
                outcome.report
            );
        } else {
            assert!(
                held,
                "a healthy release baked without a fault, not held: {:?}",
                outcome.report
            );
        }
    }
}
