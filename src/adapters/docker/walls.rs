//! The walls between instances on one engine (#54): who a container can
//! reach, and what it can do to the network it is on.
//!
//! - **No neighbours.** A service with peers runs on its instance's own
//!   network (`workload`), which the engine isolates from every other
//!   bridge. A lone service runs on [`ISOLATED_NETWORK`], one bridge
//!   created with inter-container traffic off: a container there reaches
//!   the outside world and nothing else on the bridge. Neither is the
//!   engine's default `bridge`, where every container reaches every other
//!   one on any port.
//! - **No raw sockets.** Every container drops the capabilities of
//!   `[docker] cap_drop` (by default `NET_RAW`, without which a container
//!   could spoof ARP on its bridge and read its neighbours' traffic); a
//!   catalog adds one back only where `[grants] capabilities` allows it.
//! - **Networks by identity.** A catalog's extra network is joined by the
//!   ID its exact name resolves to: Docker also resolves an ID or an ID's
//!   prefix given as a name, which could name another instance's network.
//!
//! The engine must honour the wall, not merely accept it: Podman's
//! Docker-compatible API accepts `enable_icc=false` and ignores it (and
//! does not isolate its networks from each other). stead checks what the
//! engine recorded and refuses to create a lone service's container on a
//! network that lets it reach its neighbours, unless the operator set
//! `docker.isolation = "off"` knowingly (docs/operations.md, "Podman").

use std::collections::HashMap;

use bollard::models::NetworkCreateRequest;
use bollard::query_parameters::InspectNetworkOptions;

use super::workload::{is_status, label_mismatch, labels_of};
use super::{detail, transient, DockerRuntime, LABEL_MANAGED};
use crate::core::types::RuntimeError;

/// The shared network of every lone service; not a name an instance
/// network (`stead.<instance>`) or a granted network can have.
pub const ISOLATED_NETWORK: &str = "stead_isolated";
/// Docker's bridge option that turns inter-container traffic off.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// The label that marks [`ISOLATED_NETWORK`] as stead's.
const LABEL_NETWORK: &str = "stead.network";
const LABEL_NETWORK_ISOLATED: &str = "isolated";

pub use crate::core::grants::{Isolation, CAP_DROP_DEFAULT};

/// The create call's `CapDrop` and `CapAdd`: the configured drops less
/// the ones the catalog adds back (granted when the catalog was loaded),
/// so the two lists never name one capability and the engine's order of
/// applying them does not matter.
pub(super) fn capabilities(
    cap_drop: &[String],
    cap_add: &[String],
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let drop: Vec<String> = cap_drop
        .iter()
        .filter(|c| !cap_add.contains(c))
        .cloned()
        .collect();
    (
        (!drop.is_empty()).then_some(drop),
        (!cap_add.is_empty()).then(|| cap_add.to_vec()),
    )
}

/// Why the isolated network cannot be used as it is.
fn walls_down(why: &str) -> RuntimeError {
    RuntimeError::Refused(format!(
        "network {ISOLATED_NETWORK:?} {why}, so a container there could reach every other \
         instance's; refusing to create it. Podman's compatible API ignores \
         {ICC_OPTION}=false: set docker.isolation = \"off\" in stead.toml to run without walls \
         between instances, knowingly (docs/operations.md, \"Podman\")"
    ))
}

impl DockerRuntime {
    /// Makes sure [`ISOLATED_NETWORK`] exists, is stead's and keeps its
    /// containers apart; creates it on first use. One inspect when it is
    /// there (creations are rare; a network removed by hand is made again).
    pub(super) async fn ensure_isolated_network(&self) -> Result<(), RuntimeError> {
        for _ in 0..2 {
            match self.check_isolated_network().await? {
                Some(()) => return Ok(()),
                None => self.create_isolated_network().await?,
            }
        }
        Err(RuntimeError::Transient(format!(
            "network {ISOLATED_NETWORK:?} was created but is not found"
        )))
    }

    /// `Some` when the network is there and walls its containers, `None`
    /// when it is missing.
    async fn check_isolated_network(&self) -> Result<Option<()>, RuntimeError> {
        let expected = isolated_labels();
        let network = match self
            .api()
            .inspect_network(ISOLATED_NETWORK, None::<InspectNetworkOptions>)
            .await
        {
            Ok(network) => network,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(transient("inspect network", ISOLATED_NETWORK, e)),
        };
        // Docker also answers a name with an ID prefix it matches.
        if network.name.as_deref() != Some(ISOLATED_NETWORK) {
            return Ok(None);
        }
        if let Some(mismatch) = label_mismatch(network.labels.as_ref(), &expected) {
            return Err(RuntimeError::Refused(format!(
                "network {ISOLATED_NETWORK:?} exists but is not stead's ({mismatch}); refusing \
                 to join it"
            )));
        }
        let icc = network.options.as_ref().and_then(|o| o.get(ICC_OPTION));
        if icc.map(String::as_str) != Some("false") {
            return Err(walls_down(&format!(
                "does not have {ICC_OPTION}=false (the engine recorded {})",
                icc.map_or("nothing".to_owned(), |v| format!("{v:?}"))
            )));
        }
        Ok(Some(()))
    }

    async fn create_isolated_network(&self) -> Result<(), RuntimeError> {
        let request = NetworkCreateRequest {
            name: ISOLATED_NETWORK.to_owned(),
            driver: Some("bridge".to_owned()),
            labels: Some(labels_of(&isolated_labels())),
            options: Some(HashMap::from([(ICC_OPTION.to_owned(), "false".to_owned())])),
            ..Default::default()
        };
        match self.api().create_network(request).await {
            Ok(created) => {
                tracing::info!(
                    network = ISOLATED_NETWORK,
                    "created the isolated network of lone services (inter-container traffic off)"
                );
                if !created.warning.is_empty() {
                    let warning = created.warning;
                    tracing::warn!(network = ISOLATED_NETWORK, %warning, "the engine warned");
                }
                Ok(())
            }
            // Created meanwhile by another creation: the check that follows
            // judges it.
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(transient("create network", ISOLATED_NETWORK, e)),
        }
    }

    /// The ID of the existing network whose name is exactly `name` (a
    /// catalog's granted extra network). An ID or an ID's prefix that
    /// Docker would also resolve is refused.
    pub(super) async fn resolve_network(&self, name: &str) -> Result<String, RuntimeError> {
        let network = self
            .api()
            .inspect_network(name, None::<InspectNetworkOptions>)
            .await
            .map_err(|e| {
                if is_status(&e, 404) {
                    RuntimeError::Refused(format!(
                        "network {name:?} does not exist (the catalog's networks are joined, \
                         never created: create it first)"
                    ))
                } else {
                    RuntimeError::Transient(format!(
                        "docker inspect network {name:?}: {}",
                        detail(&e)
                    ))
                }
            })?;
        match (network.name.as_deref(), network.id) {
            (Some(found), Some(id)) if found == name => Ok(id),
            (found, _) => Err(RuntimeError::Refused(format!(
                "network {name:?} resolves to a network named {found:?}: a catalog's network is \
                 joined by its exact name, never by an ID or an ID's prefix"
            ))),
        }
    }
}

fn isolated_labels() -> [(&'static str, &'static str); 2] {
    [
        (LABEL_MANAGED, "true"),
        (LABEL_NETWORK, LABEL_NETWORK_ISOLATED),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_granted_capability_is_added_and_no_longer_dropped() {
        let (drop, add) = capabilities(&list(&["NET_RAW", "MKNOD"]), &list(&["NET_RAW"]));
        assert_eq!(drop, Some(list(&["MKNOD"])));
        assert_eq!(add, Some(list(&["NET_RAW"])));
    }

    #[test]
    fn by_default_net_raw_is_dropped_and_nothing_added() {
        let default: Vec<String> = CAP_DROP_DEFAULT.iter().map(|c| (*c).to_owned()).collect();
        let (drop, add) = capabilities(&default, &[]);
        assert_eq!(drop, Some(list(&["NET_RAW"])));
        assert_eq!(add, None);
    }
}
