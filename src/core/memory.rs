//! The recovery pass's volatile memory across passes (R6, R16, R17).

use std::collections::{BTreeMap, BTreeSet};

use super::recovery::{GenerationMemory, Report, ServiceMemory};
use super::types::{
    ActiveRecord, ContainerId, GenerationKey, InstanceName, ServiceKey, ServiceName,
};

/// Budgets and verified executions per generation, and the services whose
/// last withdrawal failed. Lost on a daemon restart by design (R17).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryMemory {
    generations: BTreeMap<GenerationKey, GenerationMemory>,
    pending_withdrawals: BTreeSet<ServiceKey>,
}

impl RecoveryMemory {
    /// The memory one service's recovery starts from.
    pub fn service(&self, key: &GenerationKey) -> ServiceMemory {
        ServiceMemory {
            generation: self.generations.get(key).cloned().unwrap_or_default(),
            withdrawal_pending: self.pending_withdrawals.contains(&service_key(key)),
        }
    }

    /// Stores what a recovery leaves behind.
    pub fn apply(&mut self, report: &Report) {
        self.put(&report.key, &report.memory);
    }

    pub fn put(&mut self, key: &GenerationKey, memory: &ServiceMemory) {
        if memory.generation.is_empty() {
            self.generations.remove(key);
        } else {
            self.generations
                .insert(key.clone(), memory.generation.clone());
        }
        let service = service_key(key);
        if memory.withdrawal_pending {
            self.pending_withdrawals.insert(service);
        } else {
            self.pending_withdrawals.remove(&service);
        }
    }

    /// R16: drop history of generations ACTIVE no longer names, and pending
    /// withdrawals of services ACTIVE no longer has.
    pub fn prune(&mut self, instance: &InstanceName, active: &ActiveRecord) {
        self.generations.retain(|key, _| {
            &key.instance != instance
                || active
                    .services
                    .get(&key.service)
                    .is_some_and(|s| s.container == key.container)
        });
        self.pending_withdrawals
            .retain(|key| &key.instance != instance || active.services.contains_key(&key.service));
    }

    /// The part of the memory about one instance: what its pass starts
    /// from ([`super::pass::PassInput::memory`]).
    pub fn of_instance(&self, instance: &InstanceName) -> RecoveryMemory {
        // Keys sort by instance first: a range, not a scan of the fleet.
        let first = GenerationKey {
            instance: instance.clone(),
            service: ServiceName::new(""),
            container: ContainerId::new(""),
        };
        let first_service = ServiceKey {
            instance: instance.clone(),
            service: ServiceName::new(""),
        };
        RecoveryMemory {
            generations: self
                .generations
                .range(first..)
                .take_while(|(key, _)| &key.instance == instance)
                .map(|(key, memory)| (key.clone(), memory.clone()))
                .collect(),
            pending_withdrawals: self
                .pending_withdrawals
                .range(first_service..)
                .take_while(|key| &key.instance == instance)
                .cloned()
                .collect(),
        }
    }

    /// Replaces everything about one instance with what its pass left
    /// ([`super::pass::InstanceReport::memory`]).
    pub fn replace_instance(&mut self, instance: &InstanceName, with: RecoveryMemory) {
        let old = self.of_instance(instance);
        for key in old.generations.keys() {
            self.generations.remove(key);
        }
        for key in &old.pending_withdrawals {
            self.pending_withdrawals.remove(key);
        }
        self.generations.extend(
            with.generations
                .into_iter()
                .filter(|(key, _)| &key.instance == instance),
        );
        self.pending_withdrawals.extend(
            with.pending_withdrawals
                .into_iter()
                .filter(|key| &key.instance == instance),
        );
    }

    /// R4 etc.: forget everything about one instance that is gone.
    pub fn forget_instance(&mut self, instance: &InstanceName) {
        self.prune(instance, &ActiveRecord::default());
    }

    pub fn generation(&self, key: &GenerationKey) -> Option<&GenerationMemory> {
        self.generations.get(key)
    }

    pub fn withdrawal_pending(&self, key: &ServiceKey) -> bool {
        self.pending_withdrawals.contains(key)
    }

    pub fn generations_count(&self) -> usize {
        self.generations.len()
    }

    /// Generations whose budget currently delays the next attempt.
    pub fn delayed(&self) -> impl Iterator<Item = (&GenerationKey, &GenerationMemory)> {
        self.generations
            .iter()
            .filter(|(_, m)| m.budget.as_ref().is_some_and(|b| b.next_attempt.is_some()))
    }
}

fn service_key(key: &GenerationKey) -> ServiceKey {
    ServiceKey {
        instance: key.instance.clone(),
        service: key.service.clone(),
    }
}
