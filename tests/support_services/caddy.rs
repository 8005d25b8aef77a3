//! Caddy for tests.
