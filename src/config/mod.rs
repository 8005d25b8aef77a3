//! Reading configuration files: the one step of loading that performs I/O,
//! kept out of `core` so the core stays pure. Parsing and validation are
//! `core::catalog` and `core::plan::ControlConfig`, and [`daemon`] for the
//! daemon's own `stead.toml`.
//!
//! Every file stead reads goes through [`read_bounded`]: at most its limit
//! plus one byte is ever read, and only from a regular file, so a wrong
//! path (`/dev/zero`, a FIFO, a disk image) fails at once with a message
//! instead of filling memory or blocking.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::core::catalog::{Catalog, CatalogError, CATALOG_LEN_MAX};
use crate::core::grants::Grants;

pub mod admin_token;
pub mod daemon;

/// Why a file could not be read. The display is a sentence fragment that
/// follows the file's name: `stead.toml: is a FIFO, not a regular file`.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error(
        "is {kind}, not a regular file; stead reads its configuration from regular files only"
    )]
    NotAFile { kind: &'static str },
    #[error("is larger than {len_max} bytes, the most stead reads from it")]
    TooLarge { len_max: u64 },
    #[error("is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
}

impl ReadError {
    /// The file does not exist (a missing default config is no error).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Open(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// What a non-regular file is, for [`ReadError::NotAFile`].
fn kind_of(file_type: std::fs::FileType) -> Option<&'static str> {
    if file_type.is_file() {
        None
    } else if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if file_type.is_char_device() {
        Some("a character device")
    } else if file_type.is_block_device() {
        Some("a block device")
    } else if file_type.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Reads a regular file of at most `len_max` bytes as UTF-8. The type is
/// checked before opening (opening a FIFO would wait for a writer), the
/// open itself never blocks (`O_NONBLOCK`), the opened file is checked
/// again (the path may have changed in between), and at most `len_max + 1`
/// bytes are read, whatever the file claims its size is.
pub fn read_bounded(path: &Path, len_max: u64) -> Result<String, ReadError> {
    let metadata = std::fs::metadata(path).map_err(ReadError::Open)?;
    if let Some(kind) = kind_of(metadata.file_type()) {
        return Err(ReadError::NotAFile { kind });
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(ReadError::Open)?;
    let opened = file.metadata().map_err(ReadError::Read)?;
    if let Some(kind) = kind_of(opened.file_type()) {
        return Err(ReadError::NotAFile { kind });
    }
    let mut bytes = Vec::new();
    file.take(len_max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Read)?;
    if bytes.len() as u64 > len_max {
        return Err(ReadError::TooLarge { len_max });
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Reads, parses and validates the catalog at `path` against the
/// operator's `grants` (`stead.toml`'s `[grants]`, `DaemonConfig::grants`).
pub fn load_catalog(path: &Path, grants: &Grants) -> Result<Catalog, CatalogError> {
    let file = path.display().to_string();
    let contents = read_bounded(path, CATALOG_LEN_MAX as u64).map_err(|e| CatalogError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    Catalog::from_toml(&contents, &file, grants)
}

#[cfg(all(test, feature = "io"))]
mod tests {
    use super::*;

    #[test]
    fn devices_directories_and_fifos_are_refused_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        for (path, kind) in [
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
            (fifo.as_path(), "a FIFO (named pipe)"),
        ] {
            let error = read_bounded(path, 16).unwrap_err();
            assert!(
                matches!(error, ReadError::NotAFile { kind: k } if k == kind),
                "{path:?}: {error}"
            );
        }
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.toml");
        std::fs::write(&path, "x".repeat(17)).unwrap();
        let error = read_bounded(&path, 16).unwrap_err();
        assert_eq!(
            error.to_string(),
            "is larger than 16 bytes, the most stead reads from it"
        );
        std::fs::write(&path, "x".repeat(16)).unwrap();
        assert_eq!(read_bounded(&path, 16).unwrap().len(), 16);
    }

    #[test]
    fn missing_and_binary_files_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read_bounded(&dir.path().join("nope"), 16).unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
        let path = dir.path().join("bin");
        std::fs::write(&path, b"ab\xffcd").unwrap();
        assert_eq!(
            read_bounded(&path, 16).unwrap_err().to_string(),
            "is not UTF-8 text (invalid byte at offset 2)"
        );
    }
}
