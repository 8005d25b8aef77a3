//! What the last full recovery pass confirmed gone (R7), remembered so
//! drift reprovisions it at the next tick's planning while still fresh.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::recovery::RecoveryError;
use crate::core::types::{InstanceName, ServiceName, Timestamp};

use super::Reconciler;

/// What full passes confirmed gone (R7), per instance, with when that
/// instance's pass began (nothing it saw is older).
pub(super) type LostServices = BTreeMap<InstanceName, (Timestamp, BTreeSet<ServiceName>)>;

/// How old a pass's word on lost containers may be when the planners use
/// it, in ticks: a process frozen since (a VM pause) must look again
/// rather than reprovision on what another may have repaired meanwhile.
const LOST_SERVICES_AGE_TICKS_MAX: u32 = 2;

impl Reconciler {
    /// Learns from a full pass which services' containers it confirmed
    /// gone. Only what this pass saw counts: an instance it did not drive
    /// (busy, no lease) may have been repaired meanwhile, by the very
    /// reprovision that kept it busy.
    pub(super) fn learn_lost_services(&self, pass: &crate::engine::recovery::PassOutcome) {
        let lost: LostServices = pass
            .instances
            .iter()
            .filter_map(|(name, instance)| {
                let began_at = instance.began_at.filter(|_| instance.driven)?;
                let gone: BTreeSet<ServiceName> = instance
                    .reports
                    .iter()
                    .filter(|r| r.errors.iter().any(|e| matches!(e, RecoveryError::Gone)))
                    .map(|r| r.key.service.clone())
                    .collect();
                (!gone.is_empty()).then(|| (name.clone(), (began_at, gone)))
            })
            .collect();
        *self.lost_services.lock().unwrap_or_else(|e| e.into_inner()) = lost;
    }

    /// What the last full pass confirmed gone, where it looked recently
    /// enough to act on at `now`.
    pub(super) fn recently_lost(
        &self,
        now: Timestamp,
    ) -> BTreeMap<InstanceName, BTreeSet<ServiceName>> {
        let oldest = now
            - jiff::SignedDuration::try_from(
                self.config.tick_interval * LOST_SERVICES_AGE_TICKS_MAX,
            )
            .unwrap_or(jiff::SignedDuration::MAX);
        self.lost_services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (seen_at, _))| *seen_at >= oldest)
            .map(|(name, (_, services))| (name.clone(), services.clone()))
            .collect()
    }
}
