//! The rules judged once a pass ended: what it should have done by then,
//! read from its report.

use super::super::bake;
use super::super::fleet::add;
use super::super::pass::InstanceReport;
use super::super::recovery::{RecoveryError, Verdict};
use super::super::types::{ContainerStatus, Intent};
use super::{breach, Breach, PassJudge, Stop};

impl PassJudge<'_> {
    /// Judges the pass as it ended: `report` is its report, `abandoned`
    /// whether the driver gave it up before it finished.
    pub fn finished(&self, report: &InstanceReport, abandoned: bool) -> Result<(), Breach> {
        self.judge_revert(report, abandoned)?;
        if !abandoned {
            self.judge_stale_routes()?;
        }
        for stop in &self.stops {
            self.judge_retirement(report, stop)?;
        }
        for (service, recovery) in &self.recoveries {
            // A recovery cut short by the driver ends with what the pass
            // makes of it (failed, withdrawal pending), not its own report.
            if abandoned && self.recovering.as_ref() == Some(service) {
                continue;
            }
            if let Some(r) = report.reports.iter().find(|r| &r.key.service == service) {
                recovery.finished(r)?;
            }
        }
        Ok(())
    }

    /// #40: a revert happens exactly when a baking successor failed this
    /// pass by the rule's own reading, or an operator undid it, and not
    /// otherwise (an abandoned pass may stop short of one).
    fn judge_revert(&self, report: &InstanceReport, abandoned: bool) -> Result<(), Breach> {
        let now = self.input.now;
        let failed = self
            .baking()
            .any(|(m, back, _)| back.undone && add(m.created_at, bake::UNDO_TASK_GRACE) <= now)
            || report.reports.iter().any(|r| {
                self.baking().any(|(m, _, successor)| {
                    m.service == r.key.service
                        && successor.container == r.key.container
                        && bake::fails_while_baking(r, successor).is_some()
                })
            });
        let reverted = !self.reverts.is_empty();
        if reverted && !failed {
            return breach(
                "#40",
                format!("a revert without a failure: {:?}", self.reverts),
            );
        }
        if failed && !reverted && !abandoned {
            return breach(
                "#40",
                "a baking successor failed and the pass did not revert".to_string(),
            );
        }
        Ok(())
    }

    /// T5: every route the proxy held for a service ACTIVE does not name
    /// was withdrawn (or tried).
    fn judge_stale_routes(&self) -> Result<(), Breach> {
        let Some(held) = &self.input.held else {
            return Ok(());
        };
        for key in held.keys() {
            if !self.input.active.services.contains_key(&key.service)
                && !self.withdrawn_stale.contains(key)
            {
                return breach(
                    "T5",
                    format!("the stale route of {} was never withdrawn", key.service),
                );
            }
        }
        Ok(())
    }

    /// R15 / S5: a predecessor of a running service ACTIVE has was stopped
    /// only behind a verified, recorded, unchanged, routed successor.
    fn judge_retirement(&self, report: &InstanceReport, stop: &Stop) -> Result<(), Breach> {
        let (service, container) = (&stop.service, &stop.container);
        let Some(successor) = self.input.active.services.get(service) else {
            return Ok(());
        };
        if self.input.intent == Intent::Stopped {
            return Ok(());
        }
        let verdict = report
            .reports
            .iter()
            .find(|r| &r.key.service == service)
            .map(|r| &r.verdict);
        let Some(Verdict::Verified {
            started_at,
            published: false,
        }) = verdict
        else {
            return breach(
                "R15/S5",
                format!(
                    "retired {container} without its successor verified this pass: {verdict:?}"
                ),
            );
        };
        let unrecorded = report
            .reports
            .iter()
            .filter(|r| &r.key.service == service)
            .flat_map(|r| &r.errors)
            .any(|e| matches!(e, RecoveryError::RecordFailed(_)));
        if unrecorded {
            return breach(
                "R15/S5",
                format!("retired {container} though its successor's verified execution was never recorded"),
            );
        }
        let Some(obs) = &stop.seen else {
            return breach(
                "R15/S5",
                format!("retired {container} without inspecting the successor"),
            );
        };
        if !(obs.status == ContainerStatus::Running && obs.started_at == *started_at) {
            return breach(
                "R15/S5",
                format!(
                    "retired {container}: the successor's final inspection was {obs:?}, verified {started_at:?}"
                ),
            );
        }
        let routed = stop.routed.flatten();
        if !successor.binds.is_empty() && routed != successor.binds.values().next().copied() {
            return breach(
                "R15/S5",
                format!(
                    "retired {container} while the proxy did not route {service} to its successor"
                ),
            );
        }
        Ok(())
    }
}
