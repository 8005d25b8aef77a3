//! The recovery pass's volatile memory across passes (R6, R16, R17).

use super::hash::FastMap;
use super::recovery::{GenerationMemory, Report, ServiceMemory};
use super::types::{ActiveRecord, ContainerId, GenerationKey, InstanceName, ServiceName};

/// Budgets and verified executions per generation, and the services whose
/// last withdrawal failed. Lost on a daemon restart by design (R17).
///
/// Kept per instance, so a pass takes out and puts back one instance's
/// part in a lookup, whatever the fleet's size (issue #14); hashed, as a
/// pass looks every instance up twice and an ordered map's comparisons of
/// names were a tenth of a steady pass. The listings below sort.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryMemory {
    instances: FastMap<InstanceName, InstanceMemory>,
}

/// One instance's part of the memory: what its pass starts from and
/// leaves behind ([`super::pass::PassInput::memory`]). A handful of
/// services, so plain vectors (a map's node would allocate room for
/// eleven), and no map around them: a pass looks its own services up
/// without hashing its instance's name each time (issue #14).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceMemory {
    generations: Vec<(GenerationKey, GenerationMemory)>,
    pending_withdrawals: Vec<ServiceName>,
}

impl InstanceMemory {
    pub fn is_empty(&self) -> bool {
        self.generations.is_empty() && self.pending_withdrawals.is_empty()
    }

    fn generation(&self, key: &GenerationKey) -> Option<&GenerationMemory> {
        self.generations
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, m)| m)
    }

    /// The memory one service's recovery starts from.
    pub fn service(&self, key: &GenerationKey) -> ServiceMemory {
        ServiceMemory {
            generation: self.generation(key).cloned().unwrap_or_default(),
            withdrawal_pending: self.pending_withdrawals.contains(&key.service),
        }
    }

    /// Stores what a recovery leaves behind.
    pub fn apply(&mut self, report: &Report) {
        self.put(&report.key, &report.memory);
    }

    pub fn put(&mut self, key: &GenerationKey, memory: &ServiceMemory) {
        let at = self.generations.iter().position(|(k, _)| k == key);
        match (at, memory.generation.is_empty()) {
            (Some(at), true) => {
                self.generations.remove(at);
            }
            (Some(at), false) => self.generations[at].1 = memory.generation.clone(),
            (None, true) => {}
            (None, false) => {
                self.generations
                    .push((key.clone(), memory.generation.clone()));
                self.generations.sort_by(|a, b| a.0.cmp(&b.0));
            }
        }
        let pending = self
            .pending_withdrawals
            .iter()
            .position(|s| s == &key.service);
        match (pending, memory.withdrawal_pending) {
            (None, true) => {
                self.pending_withdrawals.push(key.service.clone());
                self.pending_withdrawals.sort();
            }
            (Some(at), false) => {
                self.pending_withdrawals.remove(at);
            }
            _ => {}
        }
    }

    /// R16: drop history of generations ACTIVE no longer names, and pending
    /// withdrawals of services ACTIVE no longer has.
    pub fn prune(&mut self, active: &ActiveRecord) {
        self.prune_keeping(active, &[]);
    }

    /// [`Self::prune`], keeping also the history of the `kept` generations
    /// (those under a `retirement-pending` marker, #40): one that becomes
    /// ACTIVE again goes on with its crash-loop budget, not a fresh one
    /// (R10: only stable minutes reset it).
    ///
    /// A kept generation keeps its budget only, never the execution it
    /// was verified and routed at: out of ACTIVE it has no route (its
    /// service's dials the successor), and whatever runs it again is
    /// checked by whoever puts it back in ACTIVE. An operator's undo
    /// starts and verifies it while the successor serves and records that
    /// execution in ACTIVE (`core::undo`); an execution remembered from
    /// before the upgrade would make that verified one look new and
    /// withdraw the successor's route before publishing it (R8): the gap
    /// the undo exists to avoid. Nor its unhealthy streak, which was that
    /// execution's (R12): counted on, the execution an undo starts was
    /// restarted at its first unhealthy read (found by the simulation's
    /// S12, the fifty-instance world's seed 2, once operators undid to
    /// recorded versions).
    pub(crate) fn prune_keeping(&mut self, active: &ActiveRecord, kept: &[&ContainerId]) {
        self.generations.retain_mut(|(key, memory)| {
            let in_active = active
                .services
                .get(&key.service)
                .is_some_and(|s| s.container == key.container);
            if in_active {
                return true;
            }
            memory.verified_started_at = None;
            if let Some(budget) = &mut memory.budget {
                budget.unhealthy_streak = 0;
            }
            kept.contains(&&key.container) && !memory.is_empty()
        });
        self.pending_withdrawals
            .retain(|service| active.services.contains_key(service));
    }
}

impl RecoveryMemory {
    /// The memory one service's recovery starts from.
    pub fn service(&self, key: &GenerationKey) -> ServiceMemory {
        self.instances
            .get(&key.instance)
            .map_or_else(ServiceMemory::default, |i| i.service(key))
    }

    /// The part of the memory about one instance: what its pass starts
    /// from ([`super::pass::PassInput::memory`]).
    pub fn of_instance(&self, instance: &InstanceName) -> InstanceMemory {
        self.instances.get(instance).cloned().unwrap_or_default()
    }

    /// Replaces everything about one instance with what its pass left
    /// ([`super::pass::InstanceReport::memory`]).
    pub fn replace_instance(&mut self, instance: &InstanceName, with: InstanceMemory) {
        if with.is_empty() {
            self.instances.remove(instance);
        } else {
            self.instances.insert(instance.clone(), with);
        }
    }

    /// R4 etc.: forget everything about one instance that is gone.
    pub fn forget_instance(&mut self, instance: &InstanceName) {
        self.instances.remove(instance);
    }

    pub fn generation(&self, key: &GenerationKey) -> Option<&GenerationMemory> {
        self.instances.get(&key.instance)?.generation(key)
    }

    /// Every generation remembered, in order.
    pub fn generation_keys(&self) -> impl Iterator<Item = &GenerationKey> {
        let mut keys: Vec<&GenerationKey> = self
            .instances
            .values()
            .flat_map(|i| i.generations.iter().map(|(k, _)| k))
            .collect();
        keys.sort();
        keys.into_iter()
    }

    /// Every instance something is remembered of.
    pub fn instance_names(&self) -> impl Iterator<Item = &InstanceName> {
        let mut names: Vec<&InstanceName> = self.instances.keys().collect();
        names.sort();
        names.into_iter()
    }

    pub fn generations_count(&self) -> usize {
        self.instances.values().map(|i| i.generations.len()).sum()
    }

    /// Generations whose budget currently delays the next attempt, in no
    /// particular order.
    pub fn delayed(&self) -> impl Iterator<Item = (&GenerationKey, &GenerationMemory)> {
        self.instances
            .values()
            .flat_map(|i| i.generations.iter().map(|(k, m)| (k, m)))
            .filter(|(_, m)| m.budget.as_ref().is_some_and(|b| b.next_attempt.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetEntry;
    use crate::types::ContainerId;

    /// Stores one service's memory the way the engine does: the instance's
    /// memory copied out, changed by its pass, and put back whole.
    fn put(memory: &mut RecoveryMemory, key: &GenerationKey, service: &ServiceMemory) {
        let mut instance = memory.of_instance(&key.instance);
        instance.put(key, service);
        memory.replace_instance(&key.instance, instance);
    }

    /// ... and pruned the same way (R16).
    fn prune(memory: &mut RecoveryMemory, instance: &InstanceName, active: &ActiveRecord) {
        let mut remembered = memory.of_instance(instance);
        remembered.prune(active);
        memory.replace_instance(instance, remembered);
    }

    /// A fleet that churns must not keep a husk per instance it once
    /// remembered: memory at rest is what issue #14 budgets per service.
    #[test]
    fn an_instance_whose_memory_empties_leaves_nothing_behind() {
        let key = GenerationKey {
            instance: InstanceName::new("a"),
            service: ServiceName::new("web"),
            container: ContainerId::new("c1"),
        };
        let remembered = ServiceMemory {
            generation: GenerationMemory {
                budget: None,
                verified_started_at: Some(jiff::Timestamp::from_second(1).unwrap()),
            },
            withdrawal_pending: true,
        };
        let mut memory = RecoveryMemory::default();
        put(&mut memory, &key, &remembered);
        assert_eq!(memory.generations_count(), 1);
        put(&mut memory, &key, &ServiceMemory::default());
        assert_eq!(memory, RecoveryMemory::default(), "emptied by put");
        put(&mut memory, &key, &remembered);
        prune(&mut memory, &key.instance, &ActiveRecord::default());
        assert_eq!(memory, RecoveryMemory::default(), "emptied by prune");
        put(&mut memory, &key, &remembered);
        memory.forget_instance(&key.instance);
        assert_eq!(memory, RecoveryMemory::default(), "forgotten (R4, R16)");
    }

    /// #40: a generation under a marker keeps its budget out of ACTIVE,
    /// not the execution it was routed at nor that execution's unhealthy
    /// streak; one with nothing else to keep goes. ACTIVE's keeps both.
    #[test]
    fn a_kept_generation_keeps_its_budget_not_its_routed_execution() {
        let key = |container: &str| GenerationKey {
            instance: InstanceName::new("a"),
            service: ServiceName::new("web"),
            container: ContainerId::new(container),
        };
        let (successor, charged, routed_only) = (key("c2"), key("c1"), key("c0"));
        let at = Some(jiff::Timestamp::from_second(1_000).unwrap());
        let budget = Some(BudgetEntry {
            failures: 1,
            ..BudgetEntry::default()
        });
        let unhealthy = Some(BudgetEntry {
            unhealthy_streak: 1,
            ..budget.clone().unwrap()
        });
        let with = |budget: Option<BudgetEntry>| ServiceMemory {
            generation: GenerationMemory {
                budget,
                verified_started_at: at,
            },
            withdrawal_pending: false,
        };
        let mut remembered = InstanceMemory::default();
        remembered.put(&successor, &with(None));
        remembered.put(&charged, &with(unhealthy));
        remembered.put(&routed_only, &with(None));
        let mut active = ActiveRecord::default();
        active.services.insert(
            ServiceName::new("web"),
            crate::types::ActiveService {
                container: successor.container.clone(),
                effective_revision: "2".into(),
                binds: Default::default(),
                stop_grace: None,
                verified_started_at: at,
            },
        );
        remembered.prune_keeping(&active, &[&charged.container, &routed_only.container]);
        assert_eq!(remembered.service(&successor), with(None));
        assert_eq!(
            remembered.service(&charged).generation,
            GenerationMemory {
                budget,
                verified_started_at: None,
            }
        );
        assert_eq!(remembered.generation(&routed_only), None);
    }

    /// What the engine's gauge (`stead_budget_delays_in_force`) and the
    /// simulation's R16 checker read: every generation remembered, and
    /// those whose budget delays the next attempt.
    #[test]
    fn generations_and_delays_are_listed_as_remembered() {
        let key = |service: &str, container: &str| GenerationKey {
            instance: InstanceName::new("a"),
            service: ServiceName::new(service),
            container: ContainerId::new(container),
        };
        let (routed, delayed, failed) = (key("api", "c1"), key("web", "c2"), key("db", "c3"));
        let at = jiff::Timestamp::from_second(1_000).unwrap();
        let with = |budget: Option<BudgetEntry>, verified: Option<jiff::Timestamp>| ServiceMemory {
            generation: GenerationMemory {
                budget,
                verified_started_at: verified,
            },
            withdrawal_pending: false,
        };
        let mut memory = RecoveryMemory::default();
        put(&mut memory, &routed, &with(None, Some(at)));
        put(
            &mut memory,
            &delayed,
            &with(
                Some(BudgetEntry {
                    failures: 3,
                    next_attempt: Some(at),
                    ..BudgetEntry::default()
                }),
                None,
            ),
        );
        put(
            &mut memory,
            &failed,
            &with(
                Some(BudgetEntry {
                    failures: 1,
                    ..BudgetEntry::default()
                }),
                None,
            ),
        );
        let mut keys: Vec<_> = memory.generation_keys().cloned().collect();
        keys.sort();
        let mut want = vec![routed, delayed.clone(), failed];
        want.sort();
        assert_eq!(keys, want);
        let delays: Vec<_> = memory.delayed().map(|(k, _)| k.clone()).collect();
        assert_eq!(delays, vec![delayed]);
    }
}
