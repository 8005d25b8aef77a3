//! The admin endpoints' bearer token (`admin_token_file` in `stead.toml`):
//! read from its file like every other file stead reads
//! ([`super::read_bounded`]), compared in constant time, and never shown
//! (its `Debug` hides it).

use std::path::Path;

/// Shortest token accepted, in bytes: anything shorter can be guessed.
pub const ADMIN_TOKEN_LEN_MIN: usize = 16;
/// Longest token file read, in bytes.
pub const ADMIN_TOKEN_FILE_LEN_MAX: u64 = 4096;
const _: () = assert!(ADMIN_TOKEN_LEN_MIN as u64 <= ADMIN_TOKEN_FILE_LEN_MAX);

/// A bearer token: the file's text without surrounding whitespace (a
/// trailing newline is how most editors and `openssl rand` leave it).
#[derive(Clone)]
pub struct AdminToken(Vec<u8>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(hidden)")
    }
}

/// Why the token file is not usable; the display follows the field and
/// the path (`admin_token_file = "/etc/stead/token": is empty`).
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    #[error("admin_token_file = {path:?}: {source}")]
    Read {
        path: String,
        #[source]
        source: super::ReadError,
    },
    #[error(
        "admin_token_file = {path:?}: the token is {len} bytes; at least {ADMIN_TOKEN_LEN_MIN} \
         are needed (e.g. `openssl rand -hex 32 > {path}`), and it may hold no whitespace"
    )]
    TooWeak { path: String, len: usize },
}

impl AdminToken {
    /// Reads the token from `path`.
    pub fn read(path: &Path) -> Result<Self, AdminTokenError> {
        let shown = path.display().to_string();
        let text = super::read_bounded(path, ADMIN_TOKEN_FILE_LEN_MAX).map_err(|source| {
            AdminTokenError::Read {
                path: shown.clone(),
                source,
            }
        })?;
        Self::from_text(&text).ok_or(AdminTokenError::TooWeak {
            path: shown,
            len: text.trim().len(),
        })
    }

    /// The token `text` holds, when it is long enough and one word.
    pub fn from_text(text: &str) -> Option<Self> {
        let token = text.trim();
        let one_word = !token.chars().any(char::is_whitespace);
        (token.len() >= ADMIN_TOKEN_LEN_MIN && one_word).then(|| Self(token.as_bytes().to_vec()))
    }

    /// Whether an `Authorization` header's value presents this token
    /// (`Bearer <token>`). The token is compared in constant time, so the
    /// time of a refusal says nothing of how much of a guess was right.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some(presented) = strip_bearer(value) else {
            return false;
        };
        constant_time_eq(presented, &self.0)
    }

    /// The header value that presents this token, for the CLI.
    pub fn header_value(&self) -> Vec<u8> {
        [b"Bearer ".as_slice(), &self.0].concat()
    }
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths
/// only: every byte is compared, the differences folded together, and
/// `black_box` keeps the compiler from stopping at the first one. (The
/// token's length is no secret worth this care: it says nothing of its
/// bytes.)
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(difference) == 0
}

/// The credentials of a `Bearer` authorization (the scheme is
/// case-insensitive, RFC 7235).
fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    scheme.eq_ignore_ascii_case(SCHEME).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    #[test]
    fn only_the_exact_token_behind_bearer_is_admitted() {
        let token = AdminToken::from_text(&format!("{TOKEN}\n")).unwrap();
        let admits = |value: &str| token.admits(Some(value.as_bytes()));
        assert!(admits(&format!("Bearer {TOKEN}")));
        assert!(admits(&format!("bearer {TOKEN}")));
        assert!(token.admits(Some(&token.header_value())));
        for refused in [
            String::new(),
            TOKEN.to_owned(),
            format!("Basic {TOKEN}"),
            format!("Bearer {TOKEN}x"),
            format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
            format!("Bearer  {TOKEN}"),
            "Bearer".to_owned(),
        ] {
            assert!(!admits(&refused), "{refused:?}");
        }
        assert!(!token.admits(None));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        for (a, b) in [
            ("", ""),
            ("a", "a"),
            ("abc", "abd"),
            ("abc", "ab"),
            ("", "x"),
        ] {
            assert_eq!(
                constant_time_eq(a.as_bytes(), b.as_bytes()),
                a == b,
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn a_short_or_spaced_token_is_refused_and_the_token_is_never_shown() {
        assert!(AdminToken::from_text("short").is_none());
        assert!(AdminToken::from_text("0123456789 abcdef0123").is_none());
        let token = AdminToken::from_text(TOKEN).unwrap();
        assert!(!format!("{token:?}").contains(TOKEN));
    }

    #[test]
    fn the_token_file_is_read_bounded_and_its_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "tiny\n").unwrap();
        let e = AdminToken::read(&path).unwrap_err().to_string();
        assert!(e.starts_with("admin_token_file = \""), "{e}");
        assert!(e.contains("the token is 4 bytes"), "{e}");
        let e = AdminToken::read(&dir.path().join("absent")).unwrap_err();
        assert!(e.to_string().contains("cannot open"), "{e}");
        let e = AdminToken::read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        let token = AdminToken::read(&path).unwrap();
        assert!(token.admits(Some(format!("Bearer {TOKEN}").as_bytes())));
    }
}
