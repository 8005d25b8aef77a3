//! The stead daemon and CLI.
fn main() {}
