//! `catalog`: arbitrary bytes (the text itself when valid UTF-8, else its
//! lossy decoding) into `Catalog::from_toml`. Asserted: no panic; the same
//! text gives the same answer twice; an error names the file and, when a
//! value is invalid, its dotted field and the value; an accepted catalog
//! satisfies every bound `core/src/catalog/` documents and validates.
#![no_main]

use std::borrow::Cow;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stead::core::catalog::{
    Catalog, CatalogEntry, CatalogError, ARGS_MAX, ARG_LEN_MAX, ATTEMPTS_MAX, CATALOG_LEN_MAX,
    DURATION_MS_MAX, IMAGE_LEN_MAX, LOG_PATTERN_LEN_MAX, NAME_LEN_MAX, PORTS_MAX, SERVICES_MAX,
    SERVICE_TYPES_MAX, VERSION_LEN_MAX,
};
use stead::core::grants::Grants;
use stead::core::release::{Provisioning, ReleaseParams};
use stead::core::spec::{ReadinessProbe, ServiceSpec};

const FILE: &str = "fuzz.toml";

fn duration_max() -> Duration {
    Duration::from_millis(DURATION_MS_MAX as u64)
}

/// The catalog's rule for service-type and service names: a DNS label.
fn is_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= NAME_LEN_MAX
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_text(value: &str, len_max: usize) -> bool {
    !value.is_empty() && value.len() <= len_max && !value.chars().any(char::is_whitespace)
}

fn check_argv(args: &[String], required: bool) {
    assert!(!required || !args.is_empty(), "an empty required command");
    assert!(args.len() <= ARGS_MAX, "{} arguments", args.len());
    assert!(args.iter().all(|a| a.len() <= ARG_LEN_MAX));
}

fn check_duration(value: Duration, min: Duration) {
    assert!(
        (min..=duration_max()).contains(&value),
        "{value:?} outside {min:?}..={:?}",
        duration_max()
    );
}

fn check_count(n: u32) {
    assert!((1..=ATTEMPTS_MAX as u32).contains(&n), "count {n}");
}

fn check_service(service: &ServiceSpec) {
    let ms = Duration::from_millis(1);
    assert!(is_name(service.name.as_str()), "service {:?}", service.name);
    assert!(
        is_text(&service.image, IMAGE_LEN_MAX),
        "image {:?}",
        service.image
    );
    check_argv(&service.command, false);
    assert!(service.ports.len() <= PORTS_MAX);
    for (i, port) in service.ports.iter().enumerate() {
        assert_ne!(*port, 0);
        assert!(!service.ports[..i].contains(port), "duplicate port {port}");
    }
    if let Some(hc) = &service.healthcheck {
        check_argv(&hc.command, true);
        check_duration(hc.interval, ms);
        check_duration(hc.timeout, ms);
        check_count(hc.retries);
    }
    match &service.readiness {
        ReadinessProbe::None => {}
        ReadinessProbe::Http {
            port,
            path,
            timeout,
            interval,
            attempts_max,
        } => {
            assert!(service.ports.contains(port), "probe port {port}");
            assert!(path.starts_with('/') && path.len() <= ARG_LEN_MAX);
            assert!(!path.chars().any(char::is_whitespace), "path {path:?}");
            check_duration(*timeout, ms);
            check_duration(*interval, ms);
            check_count(*attempts_max);
        }
        ReadinessProbe::Tcp {
            port,
            timeout,
            interval,
            attempts_max,
        } => {
            assert!(service.ports.contains(port), "probe port {port}");
            check_duration(*timeout, ms);
            check_duration(*interval, ms);
            check_count(*attempts_max);
        }
        ReadinessProbe::Log { pattern, timeout } => {
            assert!(!pattern.is_empty() && pattern.len() <= LOG_PATTERN_LEN_MAX);
            assert!(!pattern.contains(['\n', '\r']), "pattern {pattern:?}");
            check_duration(*timeout, ms);
        }
    }
    check_duration(service.stop_grace, Duration::ZERO);
}

fn check_entry(key: &str, entry: &CatalogEntry) {
    assert_eq!(key, entry.service_type);
    assert!(
        is_name(&entry.service_type),
        "type {:?}",
        entry.service_type
    );
    assert!(
        is_text(&entry.version, VERSION_LEN_MAX),
        "version {:?}",
        entry.version
    );
    match &entry.provisioning {
        Provisioning::Docker => assert!((1..=SERVICES_MAX).contains(&entry.services.len())),
        Provisioning::Helm(chart) => {
            assert!(entry.services.is_empty(), "a helm type with services");
            for arg in [&chart.chart, &chart.chart_version] {
                assert!(
                    !arg.starts_with('-') && !arg.is_empty(),
                    "helm argument {arg:?}"
                );
                assert!(
                    !arg.chars().any(char::is_whitespace),
                    "helm argument {arg:?}"
                );
            }
            // Every accepted template renders for the sample the catalog
            // checks with (a longer instance name may still overflow a
            // namespace; that is reported per instance, BadRelease).
            let parameters = entry.parameters_of(
                &entry
                    .parameters
                    .keys()
                    .map(|name| (name.clone(), "p".to_owned()))
                    .collect(),
            );
            let sample = ReleaseParams {
                instance: "i",
                team: "t",
                service_type: "s",
                version: "v",
                parameters: &parameters,
            };
            let release = chart
                .release_of(&sample, false)
                .expect("a valid chart renders");
            assert!(
                is_name(&release.namespace),
                "namespace {:?}",
                release.namespace
            );
        }
    }
    for (i, service) in entry.services.iter().enumerate() {
        check_service(service);
        assert!(
            entry.services[..i].iter().all(|s| s.name != service.name),
            "duplicate service {:?}",
            service.name
        );
    }
}

fn check_accepted(catalog: &Catalog) {
    assert!(catalog.len() <= SERVICE_TYPES_MAX);
    for entry in catalog.entries() {
        let found = catalog
            .get(&entry.service_type)
            .expect("listed entries are found");
        check_entry(&found.service_type, entry);
    }
}

fn check_rejected(contents: &str, error: &CatalogError) {
    let message = error.to_string();
    assert!(message.starts_with(&format!("{FILE}: ")), "{message}");
    match error {
        CatalogError::TooLarge { len, .. } => assert!(*len > CATALOG_LEN_MAX),
        CatalogError::Syntax { message: m, .. } => {
            // "line L, column C: " alone would say where but not what.
            let what = match m.strip_prefix("line ") {
                Some(rest) => rest.split_once(": ").map_or("", |(_, what)| what),
                None => m.as_str(),
            };
            assert!(!what.trim().is_empty(), "{error:?}");
        }
        CatalogError::Invalid {
            field,
            value,
            reason,
            ..
        } => {
            // The one top-level key besides types is refused as moved.
            assert!(
                field.starts_with("types") || field == "host_path_prefixes",
                "field {field:?}"
            );
            assert!(!value.is_empty() && !reason.is_empty(), "{message}");
        }
        CatalogError::NotGranted {
            field,
            value,
            granted,
            ..
        } => {
            // Nothing is granted here, so every host path, secret file and
            // daemon variable is refused naming its field.
            assert!(field.starts_with("types"), "field {field:?}");
            assert!(!value.is_empty() && granted.is_empty(), "{message}");
        }
        CatalogError::Read { .. } => panic!("from_toml reads nothing: {message}"),
    }
    assert!(contents.len() <= CATALOG_LEN_MAX || matches!(error, CatalogError::TooLarge { .. }));
}

fuzz_target!(|data: &[u8]| {
    let contents = match std::str::from_utf8(data) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(data),
    };
    let result = Catalog::from_toml(&contents, FILE, &Grants::default());
    assert_eq!(
        result,
        Catalog::from_toml(&contents, FILE, &Grants::default()),
        "not deterministic"
    );
    match result {
        Ok(catalog) => check_accepted(&catalog),
        Err(error) => check_rejected(&contents, &error),
    }
});
