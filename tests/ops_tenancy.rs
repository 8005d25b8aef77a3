//! The operator commands' team scope, quotas and tokens (#54), on the
//! in-memory store: what the CLI and the tenant API both run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use stead::core::catalog::Catalog;
use stead::core::fleet::RolloutState;
use stead::core::grants::Grants;
use stead::core::types::Timestamp;
use stead::ops::{CreateRequest, Ops, OpsError, Scope, TokenRequest};
use stead::ports::{Store, TeamQuota, Tenancy, TokenRole};
use stead_testkit::store::MemoryStore;

/// `web` has one 128 MiB service with a public host name, which also
/// takes the host names given at create; `db` one service with no memory
/// limit of its own.
fn catalog() -> Arc<Catalog> {
    let toml = "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"http\"\n\
        image = \"i\"\nmemory_mb = 128\ndomains = [\"{instance}.example.com\"]\n\
        tenant_domains = true\n\
        [types.db]\nversion = \"1\"\n[[types.db.services]]\nname = \"pg\"\nimage = \"p\"\n";
    Arc::new(Catalog::from_toml(toml, "catalog.toml", &Grants::default()).unwrap())
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn ops(store: &dyn Store, now: Timestamp) -> Ops<'_> {
    Ops::new(store, catalog(), now, 1)
}

fn request(name: &str, service_type: &str, team: &str) -> CreateRequest {
    CreateRequest {
        domains: Vec::new(),
        name: name.into(),
        service_type: service_type.into(),
        team: team.into(),
        version: None,
        ttl: None,
        maintenance_window: None,
        exists_ok: false,
        parameters: BTreeMap::new(),
    }
}

#[tokio::test]
async fn a_team_scope_finds_only_its_own_instances_and_changes_no_other() {
    let store = MemoryStore::new();
    let fleet = ops(&store, at(0));
    fleet.create(&request("shop", "web", "a")).await.unwrap();
    fleet.create(&request("blog", "web", "b")).await.unwrap();
    let b = ops(&store, at(1)).scoped(Scope::Team("b".into()));
    for result in [
        b.find("shop").await.map(|_| ()),
        b.set_stopped("shop", true).await.map(|_| ()),
        b.delete("shop", false).await.map(|_| ()),
    ] {
        assert!(matches!(result, Err(OpsError::NotFound(_))), "{result:?}");
    }
    let listed: Vec<String> = b
        .list(false)
        .await
        .unwrap()
        .iter()
        .map(|i| i.name.to_string())
        .collect();
    assert_eq!(listed, ["blog"]);
    let shop = fleet.find("shop").await.unwrap();
    assert!(!shop.stopped);
    assert_eq!(shop.state, stead::core::fleet::InstanceState::Provisioning);
    // A team's scope creates for itself only, and switches no rollout.
    let other = b.create(&request("x", "web", "a")).await;
    assert!(matches!(other, Err(OpsError::Invalid(_))), "{other:?}");
    let halt = b.set_rollout("web", RolloutState::Halted, "t").await;
    assert!(matches!(halt, Err(OpsError::Invalid(_))), "{halt:?}");
    assert!(store.rollouts().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_create_counts_memory_and_public_hosts_against_its_teams_quota() {
    let store = MemoryStore::new();
    let quota = TeamQuota {
        domain_suffixes: Vec::new(),
        max_instances: None,
        max_memory_mb: Some(300),
        max_public_hosts: Some(1),
    };
    let teams = Arc::new(BTreeMap::from([("a".to_owned(), quota)]));
    let ops = ops(&store, at(0)).with_quotas(teams, 64 * 1024 * 1024);
    ops.create(&request("one", "web", "a")).await.unwrap();
    let hosts = ops.create(&request("two", "web", "a")).await.unwrap_err();
    assert_eq!(
        hosts.to_string(),
        "team \"a\" is at its quota max_public_hosts = 1: 1 in use, this instance asks for \
         1 more"
    );
    // `db` sets no memory limit: it counts the default, 64 MiB.
    ops.create(&request("db1", "db", "a")).await.unwrap();
    ops.create(&request("db2", "db", "a")).await.unwrap();
    let memory = ops.create(&request("db3", "db", "a")).await.unwrap_err();
    assert!(matches!(memory, OpsError::Conflict(_)));
    assert_eq!(
        memory.to_string(),
        "team \"a\" is at its quota max_memory_mb = 300: 256 in use, this instance asks for \
         64 more"
    );
    // Another team has no quota.
    ops.create(&request("other", "web", "b")).await.unwrap();
}

#[tokio::test]
async fn a_token_authenticates_until_it_is_revoked_or_expires() {
    let store = MemoryStore::new();
    let ops = ops(&store, at(0));
    let request = TokenRequest {
        team: "a".into(),
        role: TokenRole::Tenant,
        expires_in: Some(Duration::from_secs(60)),
        label: "ci".into(),
    };
    let (token, secret) = ops.create_token(&request).await.unwrap();
    assert!(
        secret.starts_with("stead_") && secret.len() == 6 + 64,
        "{secret}"
    );
    assert!(!token.secret_sha256.contains(&secret[6..]));
    let found = ops.authenticate(&secret).await.unwrap().unwrap();
    assert_eq!((found.id, found.team.as_str()), (token.id, "a"));
    assert_eq!(ops.authenticate("stead_nope").await.unwrap(), None);
    assert_eq!(ops.authenticate(&secret[6..]).await.unwrap(), None);
    let later = self::ops(&store, at(61));
    assert_eq!(later.authenticate(&secret).await.unwrap(), None, "expired");
    let (_, second) = ops.create_token(&request).await.unwrap();
    assert_ne!(second, secret, "every token is new");
    let id = store.tokens().await.unwrap()[1].id;
    assert!(ops.revoke_token(id).await.unwrap());
    assert!(
        !ops.revoke_token(id).await.unwrap(),
        "revoking twice is safe"
    );
    assert_eq!(ops.authenticate(&second).await.unwrap(), None, "revoked");
    let bad_team = TokenRequest {
        team: "Not A Team".into(),
        ..request
    };
    assert!(matches!(
        ops.create_token(&bad_team).await,
        Err(OpsError::Invalid(_))
    ));
}

/// Teams `a` (allowed `a.example`, at most three public hosts) and `b`
/// (allowed `b.example`), as `stead.toml` gives them.
fn teams_with_domains() -> Arc<BTreeMap<String, TeamQuota>> {
    let team = |suffix: &str, max_public_hosts| TeamQuota {
        domain_suffixes: vec![suffix.to_owned()],
        max_public_hosts,
        ..TeamQuota::default()
    };
    Arc::new(BTreeMap::from([
        ("a".to_owned(), team("a.example", Some(3))),
        ("b".to_owned(), team("b.example", None)),
    ]))
}

fn with_domains(name: &str, service_type: &str, team: &str, domains: &[&str]) -> CreateRequest {
    CreateRequest {
        domains: domains.iter().map(|d| (*d).to_owned()).collect(),
        ..request(name, service_type, team)
    }
}

#[tokio::test]
async fn a_tenant_gives_host_names_only_within_its_teams_domains() {
    let store = MemoryStore::new();
    let a = ops(&store, at(0))
        .with_quotas(teams_with_domains(), 64 * 1024 * 1024)
        .scoped(Scope::Team("a".into()));
    let created = a
        .create(&with_domains("shop", "web", "a", &["shop.a.example"]))
        .await
        .unwrap();
    assert_eq!(created.instance.domains, ["shop.a.example"]);
    // Stored, not only answered: every later read carries them.
    assert_eq!(a.find("shop").await.unwrap().domains, ["shop.a.example"]);
    let refused = |request: CreateRequest| {
        let a = &a;
        async move { a.create(&request).await.unwrap_err().to_string() }
    };
    assert_eq!(
        refused(with_domains("x", "web", "a", &["shop.b.example"])).await,
        r#"--domain: domains[0] = "shop.b.example": not under a domain team "a" may use (teams.a.domain_suffixes: a.example)"#
    );
    assert_eq!(
        refused(with_domains("x", "web", "a", &["evila.example"])).await,
        r#"--domain: domains[0] = "evila.example": not under a domain team "a" may use (teams.a.domain_suffixes: a.example)"#
    );
    assert_eq!(
        refused(with_domains("x", "db", "a", &["x.a.example"])).await,
        r#"--domain: service type "db" serves no host names given at create (no service of it has tenant_domains = true in the catalog)"#
    );
    // Held by another live instance: refused, the holder unnamed.
    let taken = refused(with_domains("x", "web", "a", &["shop.a.example"])).await;
    assert!(
        taken.starts_with("--domain shop.a.example: another live instance"),
        "{taken}"
    );
    assert!(!taken.contains("shop "), "{taken}");
    // Each given name counts against max_public_hosts beside the
    // catalog's `{instance}.example.com`: 2 in use, 1 + 2 asked.
    let over = refused(with_domains(
        "y",
        "web",
        "a",
        &["y1.a.example", "y2.a.example"],
    ))
    .await;
    assert_eq!(
        over,
        "team \"a\" is at its quota max_public_hosts = 3: 2 in use, this instance asks for 3 more"
    );
    assert!(a.find("x").await.is_err() && a.find("y").await.is_err());
    // Team b gives names under its own domain.
    a.delete("shop", false).await.unwrap();
    let team_b = ops(&store, at(1)).with_quotas(teams_with_domains(), 64 * 1024 * 1024);
    team_b
        .create(&with_domains("blog", "web", "b", &["blog.b.example"]))
        .await
        .unwrap();
}
