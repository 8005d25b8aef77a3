//! The tenants (#54): teams with tokens acting through the very commands
//! the tenant API runs (`Ops` scoped to the token's team and held to
//! `[teams.NAME]` quotas, as `daemon/api/instances.rs` builds them),
//! concurrently with the daemons, the operators and every fault.
//!
//! Two invariants are judged here, from the store's own state and never
//! from the commands' accounting:
//! - N2: what a tenant reads holds only its team's instances, and no
//!   change a tenant makes lands on another team's instance;
//! - N3: a team's live usage never exceeds its quota.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stead::core::broken::Armed;
use stead::core::fleet::{Instance, InstanceState};
use stead::core::types::InstanceName;
use stead::ops::{CreateRequest, Deletion, Ops, Scope};
use stead::ports::TeamQuota;
use stead_testkit::store::MemoryStore;

use crate::checker::Checker;
use crate::topology::Shared;
use crate::world::{domains_of, service_name, Actors, HELM_TYPE, SERVICE_TYPE};

/// N2's two judgements.
pub const N2_READ: &str = "N2 a tenant reads only its team's instances";
pub const N2_CHANGE: &str = "N2 a tenant never changes another team's instance";
/// N3's judgement.
pub const N3_QUOTA: &str = "N3 a team's quota is never exceeded";
/// N2 for host names given at create: a name under another team's
/// domains is never taken.
pub const N2_DOMAIN: &str = "N2 a tenant gives no host name of another team's domains";

/// The domain each tenant team may give names under
/// (`teams.NAME.domain_suffixes`).
fn suffix_of(team: &str) -> String {
    format!("{team}.example")
}

/// The tenants' teams: two whose instances the fleet starts with (no
/// quota), and two that only their tenants create for, each with a quota
/// that binds.
pub const TENANT_TEAMS: [&str; 4] = ["red", "blue", "green", "teal"];

/// Each quota'd team's `[teams.NAME]`: `green` by instance count, `teal`
/// by public host names (two per instance of the Docker type).
/// Every tenant team may give host names under its own domain.
pub fn quotas() -> BTreeMap<String, TeamQuota> {
    TENANT_TEAMS
        .iter()
        .map(|team| {
            let mut quota = TeamQuota {
                domain_suffixes: vec![suffix_of(team)],
                ..TeamQuota::default()
            };
            match *team {
                "green" => quota.max_instances = Some(3),
                "teal" => quota.max_public_hosts = Some(4),
                _ => {}
            }
            ((*team).to_owned(), quota)
        })
        .collect()
}

/// Whether `quota` limits how many instances (or hosts) a team has.
fn binds(quota: &TeamQuota) -> bool {
    quota.max_instances.is_some()
        || quota.max_public_hosts.is_some()
        || quota.max_memory_mb.is_some()
}

/// The host names a create of `name` for `team` gives, if any: one of
/// its own (`NAME.TEAM.example`), one its team's instances contend for
/// (`shared.TEAM.example`), or one of another team's domain, which must
/// be refused.
fn given_domains(team: &str, name: &str, rng: &mut ChaCha8Rng) -> Vec<String> {
    match rng.random_range(0..6) {
        0 => vec![format!("{name}.{}", suffix_of(team))],
        1 => vec![format!("shared.{}", suffix_of(team))],
        2 => {
            let other = TENANT_TEAMS[rng.random_range(0..TENANT_TEAMS.len())];
            vec![format!("{name}.{}", suffix_of(other))]
        }
        _ => Vec::new(),
    }
}

/// Creates a tenant of a quota'd team sends at once: concurrent, so
/// they contend for the quota's last unit.
const BURST_MAX: u64 = 4;

pub struct Tenants {
    pub actors: Arc<Actors>,
    pub shared: Arc<Shared>,
    pub store: Arc<MemoryStore>,
    pub checker: Arc<Checker>,
    pub quotas: Arc<BTreeMap<String, TeamQuota>>,
    /// The mutation exercise's rule, handed to the commands as data.
    pub broken: Armed,
    /// Instances the tenants asked for so far (their names).
    pub created: AtomicU64,
}

impl Tenants {
    /// The command a tenant's request runs: scoped to its token's team and
    /// held to the quotas, as `ApiState::ops` builds it.
    fn ops(&self, team: &str, seed: u64) -> Ops<'_> {
        let catalog = self.shared.catalog.lock().expect("poisoned").clone();
        Ops::new(self.store.as_ref(), catalog, self.actors.clock.now(), seed)
            .with_quotas(
                self.quotas.clone(),
                stead::core::limits::ContainerLimits::default().memory_bytes_default,
            )
            .scoped(Scope::Team(team.to_owned()))
            .armed(self.broken)
    }

    /// The team of instance `id` as the store holds it.
    fn team_of_id(&self, id: i64) -> Option<String> {
        self.store
            .all_instances()
            .into_iter()
            .find(|i| i.id == id)
            .map(|i| i.team)
    }

    /// The instance `name` names in the store now (live, or deleted and
    /// not reused).
    fn named(&self, name: &str) -> Option<Instance> {
        self.store.instance_now(&InstanceName::new(name))
    }

    /// A tenant's task: a request every while, as long as the faults last.
    pub async fn run(self: Arc<Self>, team: &'static str, seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        loop {
            tokio::time::sleep(Duration::from_secs(rng.random_range(30..180))).await;
            if !self.actors.chaos.load(Ordering::Relaxed) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(60), self.step(team, &mut rng)).await;
        }
    }

    async fn step(self: &Arc<Self>, team: &'static str, rng: &mut ChaCha8Rng) {
        let seed: u64 = rng.random();
        // Any name the store knows, another team's as often as not.
        let names: Vec<InstanceName> = self
            .store
            .all_instances()
            .into_iter()
            .map(|i| i.name)
            .collect();
        let name = names
            .get(rng.random_range(0..names.len().max(1)))
            .map(|n| n.as_str().to_owned())
            .unwrap_or_else(|| "a".to_owned());
        match rng.random_range(0..6u32) {
            0 => self.list(team, seed).await,
            1 => self.get(team, &name, seed).await,
            2 => self.stop_or_start(team, &name, seed).await,
            3 => self.delete(team, &name, seed).await,
            // Only a team whose quota binds creates: the others' fleets
            // would grow without bound.
            _ if self.quotas.get(team).is_some_and(binds) => {
                let burst = rng.random_range(1..=BURST_MAX);
                self.create_burst(team, burst, rng).await;
            }
            _ => self.create_for_another_team(team, seed).await,
        }
    }

    /// `GET /v1/instances`.
    async fn list(&self, team: &str, seed: u64) {
        let Ok(listed) = self.ops(team, seed).list(false).await else {
            return;
        };
        for instance in listed {
            let owner = self.team_of_id(instance.id);
            self.checker
                .judge(N2_READ, owner.as_deref() == Some(team), || {
                    format!(
                        "team {team}'s listing holds {} of team {owner:?}",
                        instance.name
                    )
                });
        }
    }

    /// `GET /v1/instances/{name}`.
    async fn get(&self, team: &str, name: &str, seed: u64) {
        if self.named(name).is_some_and(|i| i.team != team) {
            self.checker
                .count_case("N2 case: a tenant named another team's instance");
        }
        let found = self.ops(team, seed).find(name).await;
        // `None` when nothing was found; else the found row's team.
        let owner = found
            .as_ref()
            .ok()
            .map(|i| self.team_of_id(i.id).unwrap_or_default());
        self.checker
            .judge(N2_READ, owner.as_ref().is_none_or(|o| o == team), || {
                format!(
                    "team {team} read {name}, of team {}",
                    owner.unwrap_or_default()
                )
            });
    }

    /// `POST /v1/instances/{name}/stop` or `/start`. A change the command
    /// says it made must have landed on an instance of the tenant's team.
    async fn stop_or_start(&self, team: &str, name: &str, seed: u64) {
        let Some(before) = self.named(name) else {
            return;
        };
        let stopped = !before.stopped;
        let result = self.ops(team, seed).set_stopped(name, stopped).await;
        let after = self.named(name);
        let Ok(changed) = result else {
            return;
        };
        // The instance the command found: the one the name held
        // throughout (a name freed and taken again meanwhile says nothing).
        let Some(acted) = after.filter(|a| a.id == before.id) else {
            return;
        };
        self.checker.judge(N2_CHANGE, acted.team == team, || {
            format!(
                "team {team} {} {name}, of team {}",
                if stopped { "stopped" } else { "started" },
                acted.team
            )
        });
        if changed && acted.team == team {
            // The intent's truth, as an operator's toggle keeps it.
            self.checker.truth(|t| {
                if stopped {
                    t.stopped.insert(acted.name.clone());
                } else {
                    t.stopped.remove(&acted.name);
                }
            });
            if stopped {
                self.checker.instance_stopped(&acted.name);
            }
            self.actors.counts.bump("tenant toggled intent");
        }
    }

    /// `DELETE /v1/instances/{name}`: another team's instance (which must
    /// not be found), or one the tenants made; the fleet's own instances
    /// are the operators' to delete.
    async fn delete(&self, team: &str, name: &str, seed: u64) {
        let Some(before) = self.named(name) else {
            return;
        };
        if before.team == team && !name.starts_with(team) {
            return;
        }
        let result = self.ops(team, seed).delete(name, false).await;
        let after = self.named(name);
        let Ok(deletion) = result else {
            return;
        };
        let Some(acted) = after.filter(|a| a.id == before.id) else {
            return;
        };
        self.checker.judge(N2_CHANGE, acted.team == team, || {
            format!("team {team} deleted {name}, of team {}", acted.team)
        });
        if matches!(deletion, Deletion::Started { .. }) {
            self.actors.counts.bump("tenant deleted instance");
        }
    }

    /// `POST /v1/instances` naming another team: refused.
    async fn create_for_another_team(&self, team: &str, seed: u64) {
        let other = TENANT_TEAMS
            .iter()
            .find(|t| **t != team)
            .expect("more than one team");
        let n = self.created.fetch_add(1, Ordering::Relaxed);
        let request = request(&format!("{team}x{n}"), SERVICE_TYPE, other);
        let result = self.ops(team, seed).create(&request).await;
        self.checker.judge(N2_CHANGE, result.is_err(), || {
            format!("team {team} created {} for team {other}", request.name)
        });
    }

    /// N2 for given names: a create giving a name outside the team's
    /// domain never succeeds, by the world's own rule (whole labels).
    fn judge_given(&self, team: &str, request: &CreateRequest, created: bool) {
        let own = format!(".{}", suffix_of(team));
        let foreign = request.domains.iter().any(|d| !d.ends_with(&own));
        if foreign {
            self.checker
                .count_case("N2 case: a tenant gave a name of another team's domain");
        } else if created {
            self.actors
                .counts
                .bump("tenant created instance with its own host name");
        }
        self.checker.judge(N2_DOMAIN, !(foreign && created), || {
            format!(
                "team {team} created {} with {:?}",
                request.name, request.domains
            )
        });
    }

    /// Several creates at once for the tenant's team, each its own request
    /// (its own task), as concurrent API calls are; the quota is judged
    /// after each that succeeds and once all are done.
    async fn create_burst(self: &Arc<Self>, team: &'static str, burst: u64, rng: &mut ChaCha8Rng) {
        let mut requests = Vec::new();
        for _ in 0..burst {
            let n = self.created.fetch_add(1, Ordering::Relaxed);
            // `teal`'s quota counts public hosts, which only the Docker
            // type has.
            let helm = team != "teal" && rng.random_ratio(1, 3);
            let service_type = if helm { HELM_TYPE } else { SERVICE_TYPE };
            let name = format!("{team}{n}");
            let mut request = request(&name, service_type, team);
            if !helm {
                // The Docker type's `web` takes given names (#54).
                request.domains = given_domains(team, &name, rng);
            }
            requests.push((request, rng.random()));
        }
        let tasks: Vec<_> = requests
            .into_iter()
            .map(|(request, seed): (CreateRequest, u64)| {
                let tenants = self.clone();
                tokio::spawn(async move {
                    let created = tenants.ops(team, seed).create(&request).await.is_ok();
                    if created {
                        tenants.actors.counts.bump("tenant created instance");
                    }
                    if !request.domains.is_empty() {
                        tenants.judge_given(team, &request, created);
                    }
                    judge_quotas(&tenants.checker, &tenants.store, &tenants.quotas);
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        judge_quotas(&self.checker, &self.store, &self.quotas);
    }
}

fn request(name: &str, service_type: &str, team: &str) -> CreateRequest {
    CreateRequest {
        domains: Vec::new(),
        name: name.to_owned(),
        service_type: service_type.to_owned(),
        team: team.to_owned(),
        version: None,
        ttl: None,
        maintenance_window: None,
        exists_ok: false,
        parameters: BTreeMap::new(),
    }
}

/// N3 from the store's state: each quota'd team's live (not deleted)
/// instances, and their public host names by the world's own catalog
/// (`domains_of`: the Docker type's `web` carries them, every version)
/// and the names each was given at create.
pub fn judge_quotas(checker: &Checker, store: &MemoryStore, quotas: &BTreeMap<String, TeamQuota>) {
    let hosts_per_instance = domains_of(&service_name(0)).len() as u64;
    let instances = store.all_instances();
    for (team, quota) in quotas {
        let live: Vec<&Instance> = instances
            .iter()
            .filter(|i| &i.team == team && i.state != InstanceState::Deleted)
            .collect();
        let n_instances = live.len() as u64;
        let n_hosts: u64 = live
            .iter()
            .filter(|i| i.service_type == SERVICE_TYPE)
            .map(|i| hosts_per_instance + i.domains.len() as u64)
            .sum();
        let within = |limit: Option<u64>, used: u64| limit.is_none_or(|l| used <= l);
        let at = |limit: Option<u64>, used: u64| limit == Some(used);
        if at(quota.max_instances, n_instances) || at(quota.max_public_hosts, n_hosts) {
            checker.count_case("N3 case: a team at its quota");
        }
        checker.judge(
            N3_QUOTA,
            within(quota.max_instances, n_instances) && within(quota.max_public_hosts, n_hosts),
            || {
                format!(
                    "team {team} has {n_instances} live instances and {n_hosts} public hosts, \
                     over its quota {quota:?}"
                )
            },
        );
    }
}
