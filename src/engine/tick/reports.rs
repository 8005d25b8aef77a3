//! Logging what a tick found once per change, not once per tick: failed
//! checks, warnings, bad rows and the planners' reports, with the gauges
//! an operator alerts on.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::event_log::{Event, EventKind};
use crate::core::plan::{Level, Report};
use crate::ports::StoreError;

use super::{Check, Reconciler};

impl Reconciler {
    /// Logs each failed check once when it begins to fail (or fails for a
    /// new reason) and once at info when it passes again, not every tick.
    pub(super) fn log_failures(&self, failed: &[(Check, String)]) {
        let now: BTreeSet<(Check, String)> = failed.iter().cloned().collect();
        let mut before = self.failing.lock().expect("failing poisoned");
        for (check, why) in now.difference(&before) {
            tracing::error!(check = check.as_str(), error = %why, "check failed");
        }
        let still: BTreeSet<Check> = now.iter().map(|(check, _)| *check).collect();
        let mended: BTreeSet<Check> = before
            .iter()
            .map(|(check, _)| *check)
            .filter(|check| !still.contains(check))
            .collect();
        for check in mended {
            tracing::info!(
                check = check.as_str(),
                "check {} passes again",
                check.as_str()
            );
        }
        *before = now;
    }

    /// Logs each warning once when a tick first has it and once at info
    /// when a tick no longer does, not every tick: a container that stays
    /// gone or a runtime that stays silent is one condition, not one per
    /// second.
    pub(super) fn log_warnings(&self, warnings: &[String]) {
        let now: BTreeSet<String> = warnings.iter().cloned().collect();
        let mut before = self.warned.lock().expect("warned poisoned");
        for warning in now.difference(&before) {
            tracing::warn!("{warning}");
        }
        for warning in before.difference(&now) {
            tracing::info!("no longer the case: {warning}");
        }
        *before = now;
    }

    /// Logs each bad row once when a snapshot first skips it and once at
    /// info when it reads again (mended or deleted), not every tick.
    pub(super) fn log_bad_rows<'e>(&self, bad: impl Iterator<Item = &'e StoreError>) {
        let now: BTreeSet<String> = bad.map(ToString::to_string).collect();
        let mut before = self.bad_rows.lock().expect("bad_rows poisoned");
        for error in now.difference(&before) {
            tracing::error!(error = %error, "skipped a bad row");
        }
        for error in before.difference(&now) {
            tracing::info!("no longer the case: skipped a bad row ({error})");
        }
        *before = now;
    }

    /// Logs a planner's reports once per change: each when it first
    /// appears, at its level, and once at info when it no longer does. The
    /// counts an operator alerts on stay visible as gauges, each set by the
    /// check that reports it (to zero when it reports none). While drift
    /// withholds its judgement of orphans, what it last said of them
    /// stands: neither the gauge nor the log claims they went away.
    pub(super) fn log_reports(&self, check: Check, reports: &[Report]) {
        let withheld = reports
            .iter()
            .any(|r| matches!(r, Report::OrphansWithheld { .. }));
        for (owner, gauge, counts) in REPORT_GAUGES {
            if owner == check && !(withheld && gauge == ORPHAN_GAUGE) {
                let n = reports.iter().filter(|r| counts(r)).count();
                metrics::gauge!(gauge).set(n as f64);
            }
        }
        let mut now: BTreeMap<String, (Level, bool)> = reports
            .iter()
            .map(|r| {
                let orphan = matches!(r, Report::OrphanRelease { .. });
                (r.to_string(), (r.level(), orphan))
            })
            .collect();
        let mut reported = self.reported.lock().expect("reported poisoned");
        let before = reported.entry(check).or_default();
        if withheld {
            for (text, _) in before.iter().filter(|(_, orphan)| **orphan) {
                now.entry(text.clone()).or_insert((Level::Error, true));
            }
        }
        for (text, (level, orphan)) in &now {
            if before.contains_key(text) {
                continue;
            }
            if *orphan {
                // Recorded as it is first logged, so a webhook can page
                // for it (#42); it stands until drift stops reporting it.
                self.recoverer.events().emit(Event::new(
                    EventKind::OrphanRelease,
                    self.ports.clock.now(),
                    "C5",
                    text.as_str(),
                ));
            }
            match level {
                Level::Error => tracing::error!(check = check.as_str(), "{text}"),
                Level::Warn => tracing::warn!(check = check.as_str(), "{text}"),
                Level::Info => tracing::info!(check = check.as_str(), "{text}"),
            }
        }
        for text in before.keys().filter(|t| !now.contains_key(*t)) {
            tracing::info!(check = check.as_str(), "no longer the case: {text}");
        }
        *before = now
            .into_iter()
            .map(|(text, (_, orphan))| (text, orphan))
            .collect();
    }
}

/// A gauge counting one kind of a check's reports.
type ReportGauge = (Check, &'static str, fn(&crate::core::plan::Report) -> bool);

/// Drift's count of orphan releases (C5).
const ORPHAN_GAUGE: &str = "stead_orphan_releases";

/// The reports an operator alerts on, each counted by the check that
/// reports it.
const REPORT_GAUGES: [ReportGauge; 2] = [
    (Check::Drift, ORPHAN_GAUGE, |r| {
        matches!(r, crate::core::plan::Report::OrphanRelease { .. })
    }),
    (Check::VersionDrift, "stead_unknown_type_instances", |r| {
        matches!(r, crate::core::plan::Report::UnknownServiceType { .. })
    }),
];
