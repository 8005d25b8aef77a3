//! The names of the rules the mutation exercise breaks on purpose
//! (`testkit/src/mutants.rs`, `docs/simulation.md`). Plain data: the core receives
//! the one armed, if any, as `RecoveryPolicy::broken`, and reads no switch.
//!
//! The exercise compiles only with the cargo feature `mutation-exercise`,
//! which the test kit and the simulation turn on and the daemon never does:
//! without it [`Armed`] is an empty type, every [`broken!`](crate::broken)
//! check is the constant `false`, and `Mutant` does not exist, so a release
//! build carries no code whose purpose is to break a rule
//! (`scripts/no-sabotage` checks the daemon's binary).

/// The rule the mutation exercise armed, if any: `Option<Mutant>` with the
/// feature, an empty type without it.
#[cfg(feature = "mutation-exercise")]
pub type Armed = Option<Mutant>;

/// Without the mutation exercise nothing can be armed.
#[cfg(not(feature = "mutation-exercise"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Armed;

/// Whether `$armed` (an [`Armed`]) breaks rule `$rule` (a `Mutant`
/// variant's name). The constant `false` without the feature, where
/// `$armed` (a field, the empty [`Armed`]) is only borrowed.
#[cfg(feature = "mutation-exercise")]
#[macro_export]
macro_rules! broken {
    ($armed:expr, $rule:ident) => {
        $armed == Some($crate::broken::Mutant::$rule)
    };
}

/// Whether `$armed` breaks rule `$rule`: never, without the feature.
#[cfg(not(feature = "mutation-exercise"))]
#[macro_export]
macro_rules! broken {
    ($armed:expr, $rule:ident) => {{
        let _ = &$armed;
        false
    }};
}

/// One deliberately broken rule.
#[cfg(feature = "mutation-exercise")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// R8/R12: touch the workload without withdrawing its traffic first.
    SkipWithdrawBeforeStart,
    /// R13: publish a fresh execution without probing its readiness.
    PublishBeforeReadiness,
    /// R10: find a container down again after an unconfirmed attempt and
    /// do not charge the crash loop.
    ForgetCrashLoopCharge,
    /// R15: retire a predecessor whose successor was not verified.
    RetireBeforeSuccessorVerified,
    /// R1: recover a retirement-pending predecessor in place of the
    /// container ACTIVE names.
    StartNonActive,
    /// T3: take only the in-process instance lock, not the store's row.
    SkipInstanceLockRow,
    /// T2: act without checking the lease right before an outside effect.
    ActOnExpiredLease,
    /// T4: run a task's handler on a deleting or deleted instance, and (in
    /// the in-memory store) leave a deleted instance's queued tasks queued.
    ReviveDeletedInstance,
    /// T5: never read the routes back from the traffic plane.
    ForgetProxyRoutes,
    /// T1: a restarted daemon waits out its own lease like a stranger.
    StrangerAfterRestart,
    /// T6: name containers `stead-<instance>-<service>-<revision>` again.
    DashedContainerNames,
    /// S11: publish a verified execution before recording it in ACTIVE.
    PublishBeforeRecord,
    /// C6: break a task's lease at half its length.
    BreakTaskLeaseEarly,
    /// C7: expire an instance only three minutes past its TTL.
    ExpireLate,
    /// R12: restart for health one unhealthy observation early.
    RestartBeforeThreshold,
    /// C8: order upgrade candidates without putting the own team first.
    IgnoreOwnTeam,
    /// C8: leave one upgrade slot of `max_in_flight` unused.
    UnderuseInFlight,
    /// C8 (#40): park an upgrade in the queue until its window opens,
    /// holding a slot, instead of waiting without one.
    ParkUpgradeBehindWindow,
    /// R13 (#40): ask the proxy to route a service without ports, which it
    /// refuses, so the service never counts as verified and routed.
    PublishPortless,
    /// #40: revert a successor that failed while baking without halting
    /// its type first, so version drift upgrades it straight back.
    RevertWithoutHalt,
    /// #40: replace a `stop-first` service by overlap, its successor
    /// created while the predecessor still runs on the same volume.
    OverlapStopFirst,
    /// #40: a worker ignores an undo's pin: it provisions and moves
    /// nothing to the pinned version.
    IgnoreUndoPin,
    /// #41: time local trust in a lease or lock by the monotonic clock
    /// alone, so a process whose host was suspended acts on resuming.
    TrustMonotonicOnly,
    /// #41: take a reading of the database's clock that jumped (or a
    /// first one) at its word: expire, requeue and take over by it.
    IgnoreClockJump,
    /// T1 (#41): a twin (the same identity at another site: a copied
    /// `state_dir`) takes the reconciler lease at once, live holder or
    /// not, as a restart at the holder's own site would.
    TwinTakesOver,
    /// #42: a recovery pass starts a container and writes no event of it.
    ForgetStartEvent,
    /// #42: a start the runtime refused is written to the event log as
    /// a start.
    EventForFailedStart,
    /// #44: retire a predecessor when the final inspection finds its
    /// successor running, whatever execution it runs (not necessarily
    /// the one verified and routed).
    RetireOnAnyExecution,
    /// #44: a failed upgrade retires the services the new version drops
    /// though the new version never served.
    DropOnFailedUpgrade,
    /// #44: retire a service the new version drops without withdrawing
    /// its route.
    KeepDroppedRoute,
    /// #40: a Helm bake takes a check that could not reach the cluster
    /// for a verdict that the release went bad, and rolls it back.
    UnreachableIsBad,
    /// #54: publish every host a service asks for, whoever the store
    /// says holds it, so a host moves to another instance while its
    /// holder's route is withdrawn.
    IgnoreHostReservations,
    /// #55: a bake's revert writes its marker, ACTIVE and the instance's
    /// version without the reconciler lease, so a reconciler that lost
    /// the lease mid-revert still writes them.
    UnfencedRevert,
    /// #54: a team-scoped command finds an instance by name whatever its
    /// team, so a tenant reads and changes another team's instance.
    IgnoreTeamScope,
    /// #54: a create is held to each quota plus one, so a team ends one
    /// instance (or one charge) over its quota.
    QuotaOffByOne,
    /// #54: a daemon starts with its catalog without judging it against
    /// what live instances run, so a hazardous catalog is applied unforced.
    SkipStartHazards,
    /// #54: a host name given at create is not held to the team's
    /// `domain_suffixes`, so a tenant takes a name of another team's domain.
    IgnoreDomainSuffixes,
    /// #40: a bake's revert rolls the release back to the newest revision
    /// at another chart version than the bad one, not to the version the
    /// instance records, so a release an earlier upgrade left a revision
    /// ahead ends at a version nothing records.
    RevertAwayFromBad,
    /// #55: version drift counts only upgrade tasks in flight, not the
    /// instances whose successors still bake, so the next instance is
    /// upgraded before the first one's bake has said anything.
    BakesDoNotHold,
    /// #55: a type's rollout starts as wide as `max_in_flight` allows, not
    /// one instance first and then waves that widen as bakes end well.
    NoWaves,
    /// #55: a failed upgrade whose retry falls outside its window parks in
    /// the queue until the next opening, holding its slots, instead of
    /// ending.
    ParkRetryBehindWindow,
    /// #55: a successor a revert took away is retired at once, like any
    /// superseded container, so its logs and exit code are gone.
    RemoveRevertedAtOnce,
}

#[cfg(feature = "mutation-exercise")]
impl Mutant {
    pub const ALL: [Mutant; 42] = [
        Mutant::SkipWithdrawBeforeStart,
        Mutant::PublishBeforeReadiness,
        Mutant::ForgetCrashLoopCharge,
        Mutant::RetireBeforeSuccessorVerified,
        Mutant::StartNonActive,
        Mutant::SkipInstanceLockRow,
        Mutant::ActOnExpiredLease,
        Mutant::ReviveDeletedInstance,
        Mutant::ForgetProxyRoutes,
        Mutant::StrangerAfterRestart,
        Mutant::DashedContainerNames,
        Mutant::PublishBeforeRecord,
        Mutant::BreakTaskLeaseEarly,
        Mutant::ExpireLate,
        Mutant::RestartBeforeThreshold,
        Mutant::IgnoreOwnTeam,
        Mutant::UnderuseInFlight,
        Mutant::ParkUpgradeBehindWindow,
        Mutant::PublishPortless,
        Mutant::RevertWithoutHalt,
        Mutant::OverlapStopFirst,
        Mutant::IgnoreUndoPin,
        Mutant::TrustMonotonicOnly,
        Mutant::IgnoreClockJump,
        Mutant::TwinTakesOver,
        Mutant::ForgetStartEvent,
        Mutant::EventForFailedStart,
        Mutant::RetireOnAnyExecution,
        Mutant::DropOnFailedUpgrade,
        Mutant::KeepDroppedRoute,
        Mutant::UnreachableIsBad,
        Mutant::IgnoreHostReservations,
        Mutant::UnfencedRevert,
        Mutant::IgnoreTeamScope,
        Mutant::QuotaOffByOne,
        Mutant::SkipStartHazards,
        Mutant::IgnoreDomainSuffixes,
        Mutant::RevertAwayFromBad,
        Mutant::BakesDoNotHold,
        Mutant::NoWaves,
        Mutant::ParkRetryBehindWindow,
        Mutant::RemoveRevertedAtOnce,
    ];
}
