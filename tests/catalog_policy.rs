//! The daemon's policy port (R11): a service is allowed to run only while
//! the catalog still lists it for its instance's type.

use std::sync::Arc;

use stead::core::catalog::Catalog;
use stead::core::grants::Grants;
use stead::core::types::{InstanceName, ServiceName};
use stead::daemon::CatalogPolicy;
use stead::ports::{ErrorKind, NewInstance, Policy, PolicyError, PortFailure, Store};
use stead_testkit::store::MemoryStore;

const CATALOG: &str = r#"
[types.web]
version = "1"

[[types.web.services]]
name = "http"
image = "stead-test/busybox:1"
ports = [8080]
"#;

async fn policy_with(service_type: &str) -> CatalogPolicy {
    let store = Arc::new(MemoryStore::new());
    let new = NewInstance {
        domains: Vec::new(),
        spec_digest: None,
        parameters: Default::default(),
        name: InstanceName::new("blog"),
        team: "t".into(),
        service_type: service_type.into(),
        version: "1".into(),
        expires_at: None,
        maintenance_window: None,
    };
    store
        .create_instance(&new, "2026-11-30T00:00:00Z".parse().unwrap())
        .await
        .unwrap();
    let catalog = Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap();
    CatalogPolicy::new(Arc::new(catalog), store)
}

#[tokio::test]
async fn a_service_in_the_catalog_is_granted() {
    let policy = policy_with("web").await;
    let blog = InstanceName::new("blog");
    assert_eq!(policy.check(&blog, &ServiceName::new("http")).await, Ok(()));
}

#[tokio::test]
async fn a_service_removed_from_the_catalog_is_revoked() {
    let policy = policy_with("web").await;
    let blog = InstanceName::new("blog");
    let revoked = |error: &PolicyError, says: &str| {
        assert!(
            matches!(error, PolicyError::Revoked(_)) && error.to_string().contains(says),
            "expected a revocation saying {says:?}, got {error:?}"
        );
    };
    let error = policy
        .check(&blog, &ServiceName::new("worker"))
        .await
        .unwrap_err();
    revoked(
        &error,
        "service worker is not in the catalog's \"web\"; its grant was revoked",
    );
    let policy = policy_with("gone").await;
    let error = policy
        .check(&blog, &ServiceName::new("http"))
        .await
        .unwrap_err();
    revoked(&error, "\"gone\" is not in the catalog");
    let missing = policy
        .check(&InstanceName::new("nope"), &ServiceName::new("http"))
        .await
        .unwrap_err();
    revoked(&missing, "no such instance");
}

#[tokio::test]
async fn grants_that_cannot_be_read_are_unavailable_not_revoked() {
    let store = Arc::new(MemoryStore::new());
    store.set_unavailable(true);
    let catalog = Catalog::from_toml(CATALOG, "catalog.toml", &Grants::default()).unwrap();
    let policy = CatalogPolicy::new(Arc::new(catalog), store);
    let error = policy
        .check(&InstanceName::new("blog"), &ServiceName::new("http"))
        .await
        .unwrap_err();
    assert!(matches!(error, PolicyError::Unavailable(_)), "{error:?}");
    assert_eq!(error.kind(), ErrorKind::Unavailable);
}
