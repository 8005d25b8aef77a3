//! Reading configuration files: the one step of loading that performs I/O,
//! kept out of `core` so the core stays pure. Parsing and validation are
//! `core::catalog` and `core::plan::ControlConfig`, and [`daemon`] for the
//! daemon's own `stead.toml`.

use std::path::Path;

use crate::core::catalog::{Catalog, CatalogError, CATALOG_LEN_MAX};
use crate::core::plan::{ConfigError, ControlConfig};

pub mod daemon;

/// Reads, parses and validates the catalog at `path`.
pub fn load_catalog(path: &Path) -> Result<Catalog, CatalogError> {
    let file = path.display().to_string();
    // Check the size before reading so a wrong path (a disk image, a
    // device) is refused instead of read into memory.
    let too_large = std::fs::metadata(path)
        .map(|m| m.len() > CATALOG_LEN_MAX as u64)
        .unwrap_or(false);
    if too_large {
        return Err(CatalogError::Read {
            file,
            reason: format!("larger than {CATALOG_LEN_MAX} bytes"),
        });
    }
    let contents = std::fs::read_to_string(path).map_err(|e| CatalogError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    Catalog::from_toml(&contents, &file)
}

/// Reads, parses and validates the control-loop settings at `path`.
pub fn load_control_config(path: &Path) -> Result<ControlConfig, ConfigError> {
    let file = path.display().to_string();
    let contents = std::fs::read_to_string(path).map_err(|e| ConfigError::Syntax {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    ControlConfig::from_toml(&contents, &file)
}
