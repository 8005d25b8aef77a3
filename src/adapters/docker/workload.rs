//! What a container needs besides itself: its secrets, its instance's
//! network and its named volumes.
//!
//! - **Secrets** are read when the container is created, from a file or
//!   the daemon's environment, and handed to Docker as environment
//!   variables. They never reach a label, the database, a log line, a
//!   metric or an error: errors name the secret and where it should come
//!   from, never a value.
//! - **The instance network** `stead.<instance>` is a bridge network of
//!   its own: the instance's services reach each other by service name
//!   (each container's alias) and nothing else shares it. Created with the
//!   first container, removed when the instance is uninstalled.
//! - **Named volumes** `stead.<instance>.<service>.<volume>` are created
//!   on first use and outlive every container: upgrades, reprovisions and
//!   recoveries mount the same volume. They carry the instance's row id,
//!   so an instance that reuses the name of a deleted one never mounts
//!   the earlier one's data; they are removed only on an explicit purge.
//!
//! Like containers, networks and volumes are stead's only when their
//! labels say so; anything else with the name is refused, never adopted
//! and never removed.

use std::collections::HashMap;

use bollard::errors::Error as DockerError;
use bollard::models::{
    EndpointSettings, Mount as DockerMount, MountTypeEnum, NetworkConnectRequest,
    NetworkCreateRequest, NetworkingConfig, Volume, VolumeCreateOptions,
};
use bollard::query_parameters::{InspectNetworkOptions, ListVolumesOptions, RemoveVolumeOptions};

use super::walls::{Isolation, ISOLATED_NETWORK};
use super::{detail, transient, DockerRuntime, LABEL_INSTANCE, LABEL_MANAGED, LABEL_SERVICE};
use crate::core::spec::{MountSource, SecretSource, ServiceSpec};
use crate::core::types::{ContainerId, InstanceName, RuntimeError, ServiceName};
use crate::ports::CreateContainer;

/// Label carrying the row id of the instance a volume was created for.
pub const LABEL_INSTANCE_ID: &str = "stead.instance-id";
/// Label carrying a volume's name within its service.
pub const LABEL_VOLUME: &str = "stead.volume";

/// Largest secret file read; a secret is a password or a key, not a blob.
pub const SECRET_FILE_LEN_MAX: u64 = 64 * 1024;

/// Why a secret file could not be read: [`crate::config::read_bounded`]'s
/// errors (a FIFO, a device, a directory, more than
/// [`SECRET_FILE_LEN_MAX`] bytes, not UTF-8), or the read could not run.
#[derive(Debug, thiserror::Error)]
enum SecretReadError {
    #[error("{0}")]
    Read(#[from] crate::config::ReadError),
    #[error("cannot be read: the reading task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Reads a secret file as the config is read: a regular file only, at
/// most [`SECRET_FILE_LEN_MAX`] bytes, whatever the file claims, so a
/// secret pointing at a FIFO or `/dev/zero` neither blocks creation nor
/// fills memory. On the blocking pool: the read is a syscall, not a future.
async fn read_secret_file(path: &str) -> Result<String, SecretReadError> {
    let path = std::path::PathBuf::from(path);
    let text = tokio::task::spawn_blocking(move || {
        crate::config::read_bounded(&path, SECRET_FILE_LEN_MAX)
    })
    .await??;
    Ok(text)
}

/// The instance's own network.
pub fn network_name(instance: &InstanceName) -> String {
    format!("stead.{instance}")
}

/// The Docker name of a named volume. Instance, service and volume names
/// are DNS labels (no dots), so the name is unambiguous.
pub fn volume_name(instance: &InstanceName, service: &ServiceName, volume: &str) -> String {
    format!("stead.{instance}.{service}.{volume}")
}

/// The service's secrets as `NAME=value` entries. Read on every creation,
/// so a rotated secret reaches the next container.
pub(super) async fn resolve_secrets(
    instance: &InstanceName,
    spec: &ServiceSpec,
) -> Result<Vec<String>, RuntimeError> {
    let mut entries = Vec::with_capacity(spec.run.secrets.len());
    for secret in &spec.run.secrets {
        let missing = |why: String| {
            RuntimeError::Refused(format!(
                "secret {} of {instance}/{}: {} {why}",
                secret.env,
                spec.name,
                secret.source.describe()
            ))
        };
        let value = match &secret.source {
            SecretSource::File(path) => {
                let text = read_secret_file(path)
                    .await
                    .map_err(|e| missing(e.to_string()))?;
                // `echo secret > file` writes one newline; it is not part of the secret.
                text.strip_suffix('\n')
                    .map(|t| t.strip_suffix('\r').unwrap_or(t))
                    .unwrap_or(&text)
                    .to_owned()
            }
            SecretSource::DaemonEnv(name) => std::env::var(name).map_err(|e| match e {
                std::env::VarError::NotPresent => missing("is not set".to_owned()),
                std::env::VarError::NotUnicode(_) => missing("is not UTF-8 text".to_owned()),
            })?,
        };
        if value.contains('\0') {
            return Err(missing("contains a NUL byte".to_owned()));
        }
        entries.push(format!("{}={value}", secret.env));
    }
    Ok(entries)
}

/// The create call's networking: the instance network, with the service's
/// name as the container's alias there. Docker's API before 1.44 takes one
/// network at creation; the extra ones are joined by [`DockerRuntime::join_networks`].
/// A lone service runs on the shared isolated network ([`walls`]), or with
/// `isolation = "off"` on the runtime's default network (`None`).
///
/// [`walls`]: super::walls
pub(super) fn networking(
    request: &CreateContainer,
    isolation: Isolation,
) -> Option<(String, NetworkingConfig)> {
    if !request.spec.run.instance_network {
        return match isolation {
            Isolation::Shared => Some((
                ISOLATED_NETWORK.to_owned(),
                NetworkingConfig {
                    endpoints_config: Some(HashMap::from([(
                        ISOLATED_NETWORK.to_owned(),
                        EndpointSettings::default(),
                    )])),
                },
            )),
            Isolation::Off => None,
        };
    }
    let network = network_name(&request.instance);
    let endpoint = EndpointSettings {
        aliases: Some(vec![request.spec.name.to_string()]),
        ..Default::default()
    };
    let config = NetworkingConfig {
        endpoints_config: Some(HashMap::from([(network.clone(), endpoint)])),
    };
    Some((network, config))
}

/// The mounts of the create call: named volumes by their Docker names,
/// host paths as bind mounts (the catalog allowed their prefix).
pub(super) fn mounts(request: &CreateContainer) -> Vec<DockerMount> {
    request
        .spec
        .run
        .mounts
        .iter()
        .map(|mount| {
            let (typ, source) = match &mount.source {
                MountSource::Volume(volume) => (
                    MountTypeEnum::VOLUME,
                    volume_name(&request.instance, &request.spec.name, volume),
                ),
                MountSource::HostPath(path) => (MountTypeEnum::BIND, path.clone()),
            };
            DockerMount {
                target: Some(mount.target.clone()),
                source: Some(source),
                typ: Some(typ),
                read_only: Some(mount.read_only),
                ..Default::default()
            }
        })
        .collect()
}

pub(super) fn labels_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The first expected label the object lacks, described for an error.
pub(super) fn label_mismatch(
    labels: Option<&HashMap<String, String>>,
    expected: &[(&str, &str)],
) -> Option<String> {
    expected.iter().find_map(|(label, value)| {
        let found = labels.and_then(|l| l.get(*label)).map(String::as_str);
        (found != Some(*value)).then(|| format!("label {label} is {found:?}, expected {value:?}"))
    })
}

pub(super) fn is_status(error: &DockerError, status: u16) -> bool {
    matches!(error, DockerError::DockerResponseServerError { status_code, .. } if *status_code == status)
}

impl DockerRuntime {
    /// Makes sure the instance's network exists and is stead's.
    pub(super) async fn ensure_network(&self, instance: &InstanceName) -> Result<(), RuntimeError> {
        let name = network_name(instance);
        let expected = [(LABEL_MANAGED, "true"), (LABEL_INSTANCE, instance.as_str())];
        let inspected = self
            .api()
            .inspect_network(&name, None::<InspectNetworkOptions>)
            .await;
        match inspected {
            Ok(network) => match label_mismatch(network.labels.as_ref(), &expected) {
                None => Ok(()),
                Some(mismatch) => Err(RuntimeError::Refused(format!(
                    "network {name:?} exists but is not this instance's ({mismatch}); refusing to join it"
                ))),
            },
            Err(e) if is_status(&e, 404) => {
                let request = NetworkCreateRequest {
                    name: name.clone(),
                    driver: Some("bridge".to_owned()),
                    labels: Some(labels_of(&expected)),
                    ..Default::default()
                };
                match self.api().create_network(request).await {
                    Ok(_) => {
                        tracing::info!(instance = %instance, network = %name, "created the instance network");
                        Ok(())
                    }
                    // Created meanwhile (by a crashed attempt's retry): check it.
                    Err(e) if is_status(&e, 409) => Box::pin(self.ensure_network(instance)).await,
                    Err(e) => Err(transient("create network", &name, e)),
                }
            }
            Err(e) => Err(transient("inspect network", &name, e)),
        }
    }

    /// Makes sure a named volume exists and belongs to this very instance
    /// (its row id), creating it on first use.
    pub(super) async fn ensure_volume(
        &self,
        request: &CreateContainer,
        volume: &str,
    ) -> Result<(), RuntimeError> {
        let name = volume_name(&request.instance, &request.spec.name, volume);
        let instance_id = request.instance_id.to_string();
        let expected = [
            (LABEL_MANAGED, "true"),
            (LABEL_INSTANCE, request.instance.as_str()),
            (LABEL_SERVICE, request.spec.name.as_str()),
            (LABEL_VOLUME, volume),
            (LABEL_INSTANCE_ID, instance_id.as_str()),
        ];
        let check = |found: &Volume| match label_mismatch(Some(&found.labels), &expected) {
            None => Ok(()),
            Some(mismatch) if found.labels.contains_key(LABEL_INSTANCE_ID) => {
                Err(RuntimeError::Refused(format!(
                    "volume {name:?} was kept from an earlier instance named {} ({mismatch}); \
                     it is not mounted into a new one. Remove it (`docker volume rm {name}`) \
                     or choose another instance name",
                    request.instance
                )))
            }
            Some(mismatch) => Err(RuntimeError::Refused(format!(
                "volume {name:?} exists but is not stead's ({mismatch}); refusing to mount it"
            ))),
        };
        match self.api().inspect_volume(&name).await {
            Ok(found) => check(&found),
            Err(e) if is_status(&e, 404) => {
                let options = VolumeCreateOptions {
                    name: Some(name.clone()),
                    labels: Some(labels_of(&expected)),
                    ..Default::default()
                };
                // Docker answers an existing name with that volume: check it.
                let created = self
                    .api()
                    .create_volume(options)
                    .await
                    .map_err(|e| transient("create volume", &name, e))?;
                check(&created)?;
                tracing::info!(instance = %request.instance, service = %request.spec.name, volume = %name, "created a named volume");
                Ok(())
            }
            Err(e) => Err(transient("inspect volume", &name, e)),
        }
    }

    /// Joins the container to the spec's extra networks it is not on yet
    /// (before it starts, so it never runs half-connected).
    pub(super) async fn join_networks(
        &self,
        id: &ContainerId,
        request: &CreateContainer,
    ) -> Result<(), RuntimeError> {
        if request.spec.run.networks.is_empty() {
            return Ok(());
        }
        let inspected = self.inspect_raw(id).await?;
        let joined = inspected
            .network_settings
            .and_then(|s| s.networks)
            .unwrap_or_default();
        for network in &request.spec.run.networks {
            if joined.contains_key(network) {
                continue;
            }
            let network_id = self.resolve_network(network).await?;
            let connect = NetworkConnectRequest {
                container: Some(id.to_string()),
                endpoint_config: Some(EndpointSettings {
                    aliases: Some(vec![format!("{}.{}", request.spec.name, request.instance)]),
                    ..Default::default()
                }),
            };
            self.api()
                .connect_network(&network_id, connect)
                .await
                .map_err(|e| {
                    RuntimeError::Transient(format!(
                        "docker connect {id} to network {network:?} ({}/{}): {}",
                        request.instance,
                        request.spec.name,
                        detail(&e)
                    ))
                })?;
        }
        Ok(())
    }

    /// Removes the instance's network if it is stead's; absent counts as
    /// removed. A network someone else put under the name is left alone.
    pub async fn remove_network(&self, instance: &InstanceName) -> Result<(), RuntimeError> {
        let name = network_name(instance);
        let network = match self
            .api()
            .inspect_network(&name, None::<InspectNetworkOptions>)
            .await
        {
            Ok(network) => network,
            Err(e) if is_status(&e, 404) => return Ok(()),
            Err(e) => return Err(transient("inspect network", &name, e)),
        };
        let expected = [(LABEL_MANAGED, "true"), (LABEL_INSTANCE, instance.as_str())];
        if let Some(mismatch) = label_mismatch(network.labels.as_ref(), &expected) {
            tracing::warn!(instance = %instance, network = %name, "left a network stead does not own: {mismatch}");
            return Ok(());
        }
        match self
            .api()
            .remove_network(network.id.as_deref().unwrap_or(&name))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(transient("remove network", &name, e)),
        }
    }

    /// The named volumes stead created for the instance, by Docker name.
    pub async fn instance_volumes(
        &self,
        instance: &InstanceName,
    ) -> Result<Vec<String>, RuntimeError> {
        self.volumes_labelled(instance, None).await
    }

    /// The named volumes labelled with the instance's name and, when given,
    /// its row id.
    async fn volumes_labelled(
        &self,
        instance: &InstanceName,
        instance_id: Option<crate::core::fleet::InstanceId>,
    ) -> Result<Vec<String>, RuntimeError> {
        let mut labels = vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_INSTANCE}={instance}"),
        ];
        labels.extend(instance_id.map(|id| format!("{LABEL_INSTANCE_ID}={id}")));
        let filters = HashMap::from([("label".to_owned(), labels)]);
        let listed = self
            .api()
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| transient("list volumes of", instance.as_str(), e))?;
        // Each label checked here again: Podman's API matches several
        // label filters by any of them, not all (seen with 4.3), and a
        // purge must never take a volume of another row.
        let instance_id = instance_id.map(|id| id.to_string());
        let ours = |v: &Volume| {
            let label = |key: &str| v.labels.get(key).map(String::as_str);
            label(LABEL_MANAGED) == Some("true")
                && label(LABEL_INSTANCE) == Some(instance.as_str())
                && instance_id
                    .as_deref()
                    .is_none_or(|id| label(LABEL_INSTANCE_ID) == Some(id))
        };
        let mut names: Vec<String> = listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| v.name.starts_with(&format!("stead.{instance}.")) && ours(v))
            .map(|v| v.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Removes every named volume stead created for the instance with row
    /// id `instance_id`, and says which. Only volumes whose labels name the
    /// instance and that row are touched: one kept from an earlier instance
    /// of the same name (a plain delete keeps its data) is not this one's.
    pub async fn purge_instance_volumes(
        &self,
        instance: &InstanceName,
        instance_id: crate::core::fleet::InstanceId,
    ) -> Result<Vec<String>, RuntimeError> {
        let names = self.volumes_labelled(instance, Some(instance_id)).await?;
        for name in &names {
            match self
                .api()
                .remove_volume(name, None::<RemoveVolumeOptions>)
                .await
            {
                Ok(()) => {
                    tracing::warn!(instance = %instance, volume = %name, "purged a named volume (instance delete --purge-volumes)");
                }
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(transient("remove volume", name, e)),
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::spec::{ReadinessProbe, SecretEnv};

    /// A secret read never takes long; a hang would outlast this.
    const READ_WAIT: Duration = Duration::from_secs(5);

    fn spec_with_secret_file(path: &std::path::Path) -> ServiceSpec {
        let mut spec = ServiceSpec {
            name: ServiceName::new("db"),
            image: "busybox".to_owned(),
            command: Vec::new(),
            ports: Vec::new(),
            healthcheck: None,
            readiness: ReadinessProbe::None,
            stop_grace: Duration::from_secs(1),
            update: Default::default(),
            domains: Vec::new(),
            tenant_domains: false,
            run: Default::default(),
        };
        spec.run.secrets = vec![SecretEnv {
            env: "DB_PASSWORD".into(),
            source: SecretSource::File(path.to_str().unwrap().to_owned()),
        }];
        spec
    }

    /// The refusal of a create whose secret is the file at `path`.
    async fn refusal(path: &std::path::Path) -> String {
        let resolved = tokio::time::timeout(
            READ_WAIT,
            resolve_secrets(&InstanceName::new("notes"), &spec_with_secret_file(path)),
        )
        .await
        .expect("reading a secret never hangs");
        match resolved {
            Err(RuntimeError::Refused(message)) => message,
            other => panic!("{path:?}: expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_secret_file_that_is_a_fifo_or_a_device_is_refused_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("db-password");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        for (path, kind) in [
            (fifo.as_path(), "is a FIFO (named pipe), not a regular file"),
            (
                std::path::Path::new("/dev/zero"),
                "is a character device, not a regular file",
            ),
        ] {
            let message = refusal(path).await;
            assert!(
                message.starts_with(&format!(
                    "secret DB_PASSWORD of notes/db: file {:?} {kind}",
                    path.to_str().unwrap()
                )),
                "{message}"
            );
        }
    }

    #[tokio::test]
    async fn a_secret_file_over_the_bound_is_refused_naming_it_and_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db-password");
        std::fs::write(&path, "x".repeat(SECRET_FILE_LEN_MAX as usize + 1)).unwrap();
        let message = refusal(&path).await;
        assert_eq!(
            message,
            format!(
                "secret DB_PASSWORD of notes/db: file {:?} is larger than {SECRET_FILE_LEN_MAX} \
                 bytes, the most stead reads from it",
                path.to_str().unwrap()
            )
        );
        assert!(!message.contains("xxxx"), "no value in the error");
    }

    #[tokio::test]
    async fn a_plain_secret_file_is_read_without_its_final_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db-password");
        std::fs::write(&path, "hunter2\n").unwrap();
        let entries = resolve_secrets(&InstanceName::new("notes"), &spec_with_secret_file(&path))
            .await
            .expect("a plain secret file is read");
        assert_eq!(entries, vec!["DB_PASSWORD=hunter2".to_owned()]);
    }
}
