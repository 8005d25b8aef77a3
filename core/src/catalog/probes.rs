//! The checks of a service's healthcheck and readiness probe.

use super::raw::{RawHealthcheck, RawReadiness};
use super::{
    CatalogError, Checker, ARG_LEN_MAX, HEALTHCHECK_INTERVAL_MS_DEFAULT,
    HEALTHCHECK_RETRIES_DEFAULT, HEALTHCHECK_TIMEOUT_MS_DEFAULT, LOG_PATTERN_LEN_MAX,
    LOG_PROBE_TIMEOUT_MS_DEFAULT, PROBE_ATTEMPTS_MAX_DEFAULT, PROBE_INTERVAL_MS_DEFAULT,
    PROBE_TIMEOUT_MS_DEFAULT,
};
use crate::spec::{Healthcheck, ReadinessProbe};

impl Checker<'_> {
    pub(super) fn healthcheck(
        &self,
        at: &str,
        raw: RawHealthcheck,
    ) -> Result<Healthcheck, CatalogError> {
        self.argv(&format!("{at}.command"), &raw.command, true)?;
        Ok(Healthcheck {
            command: raw.command,
            interval: self.duration(
                &format!("{at}.interval_ms"),
                raw.interval_ms,
                HEALTHCHECK_INTERVAL_MS_DEFAULT,
                1,
            )?,
            timeout: self.duration(
                &format!("{at}.timeout_ms"),
                raw.timeout_ms,
                HEALTHCHECK_TIMEOUT_MS_DEFAULT,
                1,
            )?,
            retries: self.count(
                &format!("{at}.retries"),
                raw.retries,
                HEALTHCHECK_RETRIES_DEFAULT,
            )?,
        })
    }

    pub(super) fn readiness(
        &self,
        at: &str,
        raw: RawReadiness,
        ports: &[u16],
    ) -> Result<ReadinessProbe, CatalogError> {
        if raw.kind == "none" {
            let stray = [
                ("port", raw.port.is_some()),
                ("path", raw.path.is_some()),
                ("pattern", raw.pattern.is_some()),
                ("timeout_ms", raw.timeout_ms.is_some()),
                ("interval_ms", raw.interval_ms.is_some()),
                ("attempts_max", raw.attempts_max.is_some()),
            ];
            self.refuse_set(
                at,
                &stray,
                "a readiness probe of kind \"none\" takes no other fields",
            )?;
            return Ok(ReadinessProbe::None);
        }
        if raw.kind == "log" {
            return self.log_readiness(at, raw);
        }
        if raw.kind != "http" && raw.kind != "tcp" {
            return Err(self.invalid(
                format!("{at}.kind"),
                &raw.kind,
                "must be \"http\", \"tcp\", \"log\" or \"none\"",
            ));
        }
        if let Some(pattern) = raw.pattern {
            return Err(self.invalid(
                format!("{at}.pattern"),
                pattern,
                "only a readiness probe of kind \"log\" takes a pattern",
            ));
        }
        let port_field = format!("{at}.port");
        let port_value = raw.port.ok_or_else(|| {
            self.invalid(&port_field, "missing", "an http or tcp probe needs a port")
        })?;
        let port = self.port(&port_field, port_value)?;
        if !ports.contains(&port) {
            return Err(self.invalid(
                &port_field,
                port_value,
                "the probe must dial one of the service's ports",
            ));
        }
        let timeout = self.duration(
            &format!("{at}.timeout_ms"),
            raw.timeout_ms,
            PROBE_TIMEOUT_MS_DEFAULT,
            1,
        )?;
        let interval = self.duration(
            &format!("{at}.interval_ms"),
            raw.interval_ms,
            PROBE_INTERVAL_MS_DEFAULT,
            1,
        )?;
        let attempts_max = self.count(
            &format!("{at}.attempts_max"),
            raw.attempts_max,
            PROBE_ATTEMPTS_MAX_DEFAULT,
        )?;
        if raw.kind == "tcp" {
            if let Some(path) = raw.path {
                return Err(self.invalid(format!("{at}.path"), path, "a tcp probe has no path"));
            }
            return Ok(ReadinessProbe::Tcp {
                port,
                timeout,
                interval,
                attempts_max,
            });
        }
        let path = raw.path.unwrap_or_else(|| "/".to_owned());
        if !path.starts_with('/')
            || path.len() > ARG_LEN_MAX
            || path.chars().any(char::is_whitespace)
        {
            return Err(self.invalid(
                format!("{at}.path"),
                path,
                "must start with '/' and contain no whitespace",
            ));
        }
        Ok(ReadinessProbe::Http {
            port,
            path,
            timeout,
            interval,
            attempts_max,
        })
    }

    /// Kind `log`: a pattern and a timeout, nothing to dial. The logs are
    /// followed, not polled, so there is no interval or attempt count.
    pub(super) fn log_readiness(
        &self,
        at: &str,
        raw: RawReadiness,
    ) -> Result<ReadinessProbe, CatalogError> {
        let stray = [
            ("port", raw.port.is_some()),
            ("path", raw.path.is_some()),
            ("interval_ms", raw.interval_ms.is_some()),
            ("attempts_max", raw.attempts_max.is_some()),
        ];
        self.refuse_set(
            at,
            &stray,
            "a readiness probe of kind \"log\" takes only pattern and timeout_ms",
        )?;
        let field = format!("{at}.pattern");
        let pattern = raw.pattern.ok_or_else(|| {
            self.invalid(
                &field,
                "missing",
                "a log probe needs the text its line contains",
            )
        })?;
        if pattern.is_empty()
            || pattern.len() > LOG_PATTERN_LEN_MAX
            || pattern.contains(['\n', '\r'])
        {
            return Err(self.invalid(
                &field,
                pattern,
                format!("must be 1 to {LOG_PATTERN_LEN_MAX} bytes on one line"),
            ));
        }
        let timeout = self.duration(
            &format!("{at}.timeout_ms"),
            raw.timeout_ms,
            LOG_PROBE_TIMEOUT_MS_DEFAULT,
            1,
        )?;
        Ok(ReadinessProbe::Log { pattern, timeout })
    }
}
