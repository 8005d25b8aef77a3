//! C5: live releases against the instances the database says are ready.

use super::{is_expired, Decision, Notice, Plan, Planner, Report};
use std::borrow::Cow;

use std::collections::BTreeSet;

use crate::fleet::{Instance, InstanceState, TaskKind};
use crate::release::ReleaseParams;
use crate::types::ServiceName;

impl Planner<'_, '_> {
    /// A `reprovision` of `instance` now, and the notification `event`
    /// that says why.
    fn reprovision(
        &self,
        plan: &mut Plan,
        instance: &Instance,
        event: &'static str,
        reason: String,
    ) {
        let message = format!("reprovisioning {}: {reason}", instance.name);
        plan.decisions.push(Decision::Enqueue(self.new_task(
            TaskKind::Reprovision,
            instance.id,
            self.snapshot.now,
            reason,
        )));
        plan.decisions.push(Decision::Notify(Notice {
            event,
            instance: instance.id,
            team: instance.team.clone(),
            message,
        }));
    }

    /// A ready instance whose release is gone gets one `reprovision` (safe:
    /// provisioning is install-or-upgrade on the instance's deterministic
    /// release name) and a notification, unless a reprovision is already
    /// queued or running. Expired instances are left to the TTL check.
    ///
    /// A live release no instance names is reported at error level every
    /// tick and never deleted: "the database does not know it" is one query
    /// against one database, and the release may belong to someone else.
    /// While an instance row does not decode, no release is called an
    /// orphan (it may be that row's): the report says so instead.
    ///
    /// Plans nothing when the releases could not be listed.
    pub fn drift(&self) -> Plan {
        let snapshot = self.snapshot;
        let Some(live) = &self.live else {
            return Plan::default();
        };
        let mut plan = Plan::default();
        // Which live releases some instance owns. Every instance the
        // database has not finished deleting owns its release name; a
        // deleted one does not, so its leftover release is an orphan.
        let mut owned = vec![false; live.distinct.len()];
        for instance in &snapshot.instances {
            if instance.state == InstanceState::Deleted {
                continue;
            }
            // Where its type's provisioner keeps the release: Docker's
            // labelled containers, or a Helm chart in its rendered
            // namespace.
            let Some(namespace) = self.release_namespace(instance, &mut plan) else {
                // A type the catalog does not list, or a namespace that
                // does not render: where its release lives is unknown, so
                // any release of its name is its, and none is missing.
                for (p, (name, _)) in live.distinct.iter().enumerate() {
                    if *name == instance.name.as_str() {
                        owned[p] = true;
                    }
                }
                continue;
            };
            let position = live.position(instance.name.as_str(), &namespace);
            if let Some(p) = position {
                owned[p] = true;
            }
            let lost = snapshot.lost_services.get(&instance.name);
            if position.is_some() && lost.is_some_and(|services| !services.is_empty()) {
                self.repair_lost_containers(&mut plan, instance, lost);
                continue;
            }
            if position.is_some()
                || instance.state != InstanceState::Ready
                || is_expired(instance, snapshot.now)
                || self.active_kinds(instance.id).has(TaskKind::Reprovision)
            {
                continue;
            }
            let reason = format!(
                "drift: release {} missing from namespace {namespace}",
                instance.name
            );
            self.reprovision(&mut plan, instance, "drift.release_missing", reason);
        }
        if snapshot.unreadable_instances > 0 {
            // An instance row that does not decode still owns its release:
            // calling that release an orphan would invite an operator to
            // remove a live tenant's deployment by hand.
            plan.reports.push(Report::OrphansWithheld {
                unreadable: snapshot.unreadable_instances,
            });
            return plan;
        }
        let mut orphans: Vec<(&str, &str)> = live
            .distinct
            .iter()
            .zip(&owned)
            .filter(|(_, owned)| !**owned)
            .map(|(release, _)| *release)
            .collect();
        orphans.sort_unstable();
        plan.reports
            .extend(orphans.into_iter().map(|(name, ns)| Report::OrphanRelease {
                name: name.to_owned(),
                namespace: ns.to_owned(),
            }));
        plan
    }

    /// A ready instance whose release is live but some of whose containers
    /// are gone (`lost`) gets one `reprovision`, unless a provisioning task
    /// is queued or running.
    fn repair_lost_containers(
        &self,
        plan: &mut Plan,
        instance: &Instance,
        lost: Option<&BTreeSet<ServiceName>>,
    ) {
        let snapshot = self.snapshot;
        // A stopped instance runs nothing: its lost container is
        // recreated once it is started again (S3).
        // A queued upgrade does not hold the repair back: it may be
        // a retry parked until its window opens again, a day off
        // (seed 215). The two take turns under the instance lock.
        let kinds = self.active_kinds(instance.id);
        let provisioning = [
            TaskKind::Provision,
            TaskKind::Reprovision,
            TaskKind::Deprovision,
        ]
        .into_iter()
        .any(|kind| kinds.has(kind));
        if instance.state == InstanceState::Ready
            && !instance.stopped
            && !is_expired(instance, snapshot.now)
            && !provisioning
        {
            let services: Vec<&str> = lost.into_iter().flatten().map(|s| s.as_str()).collect();
            let reason = format!(
                "drift: the container of {} is gone (removed by hand?); \
                 the rest of release {} is live",
                services.join(", "),
                instance.name
            );
            self.reprovision(plan, instance, "drift.container_missing", reason);
        }
    }

    /// The namespace `instance`'s release lives in (its name is the
    /// instance's), or `None` (reported) when that cannot be known: its
    /// type is not in the catalog, or its namespace template does not
    /// render for it.
    pub(super) fn release_namespace(
        &self,
        instance: &Instance,
        plan: &mut Plan,
    ) -> Option<Cow<'static, str>> {
        let entry = self.snapshot.catalog.get(&instance.service_type)?;
        match entry
            .provisioning
            .namespace_of(&ReleaseParams::of(instance, &instance.version))
        {
            Ok(namespace) => Some(namespace),
            Err(error) => {
                plan.reports.push(Report::BadRelease {
                    instance: instance.id,
                    name: instance.name.clone(),
                    error: error.to_string(),
                });
                None
            }
        }
    }
}
